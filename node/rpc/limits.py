"""HTTP server limits: an open-connection cap, a deadline for request headers, and a Host/Origin
allow-list (with CORS, off by default).

aiohttp accepts connections without a cap and waits for request headers without a deadline, so a
client holding many half-sent requests exhausts the process's file descriptors (shared with p2p
and RocksDB). ``ConnectionGuard`` fixes both around an aiohttp ``web.Server``:

- every connection must be inside a request within ``header_timeout`` seconds of opening, and
  within ``idle_timeout`` seconds of its last response (keep-alive), or it is closed; a connection
  inside a request is never timed out by the guard;
- at ``max_connections`` open, a new connection evicts the longest-waiting connection that is
  not inside a request; when every connection is busy the newcomer gets a 503 and is closed;
- a websocket leaves that pool for a pool of its own (ADR 0186, a node/admission.py ``Pool``):
  ``max_websockets`` in all, ``max_websockets_per_client`` per client IP, a quarter of the pool per
  /24 (/48); a full pool evicts the idlest websocket of the most-represented client (or one idle
  past a grace period) instead of refusing, and one with no message in either direction for
  ``ws_idle_timeout`` is closed. Upgraded connections never use up plain HTTP's capacity.

``HttpPolicy.check_request`` refuses what a web page could send to a node on loopback (DNS
rebinding, cross-site requests, websockets opened from another site): a Host name not in
``allowed_hosts`` or the name the server binds (IP literals are always accepted: rebinding needs
a name), and an ``Origin``
header not in ``allowed_origins`` unless it is the server's own origin (a page it served, such as
/explorer; requests without one, curl and programs, are accepted).
With ``cors`` on, allowed origins also get CORS headers and preflight answers.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from node.admission import Pool, PoolLimits

log = logging.getLogger(__name__)

LOOPBACK_ORIGINS = ("http://localhost", "http://127.0.0.1", "http://[::1]")
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
                  b"Content-Length: 25\r\n\r\ntoo many open connections")
_CORS_METHODS = "GET, POST, OPTIONS"
_CORS_HEADERS = "Content-Type"


class RequestRefused(Exception):
    """A request fails the Host/Origin policy; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _split_origin(origin: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port or None) of an origin such as ``http://localhost:3000``; None if malformed."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    return parts.scheme, parts.hostname.lower(), port


def _host_name(host_header: str) -> str:
    """The host part of a Host header (``name:port``, ``[v6]:port``), lower-case, without brackets."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def same_origin(origin: str, request: web.BaseRequest) -> bool:
    """The page making the request was served by this server (e.g. /explorer opened through the
    node's public address): the Origin's host and port are the Host header's, which has already
    passed the Host allow-list, so no other site can be behind it (ADR 0156)."""
    split = _split_origin(origin)
    host = request.headers.get("Host")
    if split is None or not host:
        return False
    scheme, name, port = split
    if scheme != request.scheme:
        return False
    want_name = _host_name(host)
    bracketed = host.strip().lower()
    tail = bracketed.rsplit("]", 1)[1] if bracketed.startswith("[") else (
        bracketed.rsplit(":", 1)[1] if bracketed.count(":") == 1 else "")
    tail = tail.lstrip(":")
    want_port = int(tail) if tail.isdigit() else (443 if scheme == "https" else 80)
    return name == want_name and (port or (443 if scheme == "https" else 80)) == want_port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HttpPolicy:
    """The [rpc] limits and allow-lists (node/config.py documents each key)."""

    max_connections: int = 256
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_websockets: int = 128
    max_websockets_per_client: int = 16
    ws_idle_timeout: float = 300.0
    ws_grace: float = 30.0          # a websocket idle this long may be evicted by any newcomer
    allowed_hosts: tuple[str, ...] = ("localhost",)
    allowed_origins: tuple[str, ...] = LOOPBACK_ORIGINS
    cors: bool = False

    @classmethod
    def from_config(cls, rpc: Mapping[str, Any]) -> HttpPolicy:
        return cls(max_connections=rpc["max_connections"], header_timeout=rpc["header_timeout"],
                   idle_timeout=rpc["idle_timeout"], max_websockets=rpc["max_websockets"],
                   max_websockets_per_client=rpc["max_websockets_per_client"], ws_idle_timeout=rpc["ws_idle_timeout"],
                   allowed_hosts=(*rpc["allowed_hosts"], rpc["host"]),   # the name it binds is its own
                   allowed_origins=tuple(rpc["allowed_origins"]), cors=rpc["cors"])

    def host_allowed(self, host_header: str | None) -> bool:
        if "*" in self.allowed_hosts or not host_header:
            return True  # HTTP/1.0 without Host: no browser sends that
        name = _host_name(host_header)
        return _is_ip(name) or name in {h.lower() for h in self.allowed_hosts}

    def origin_allowed(self, origin: str) -> bool:
        if "*" in self.allowed_origins:
            return True
        split = _split_origin(origin)
        if split is None:
            return False
        scheme, host, port = split
        for allowed in self.allowed_origins:
            want = _split_origin(allowed)
            if want is not None and want[:2] == (scheme, host) and want[2] in (None, port):
                return True
        return False

    def check_request(self, request: web.BaseRequest) -> None:
        """Raise RequestRefused unless the Host and the Origin (if any) are allowed."""
        if not self.host_allowed(request.headers.get("Host")):
            raise RequestRefused(403, f"host {request.headers.get('Host', '')[:100]!r} is not in [rpc] allowed_hosts")
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin) and not same_origin(origin, request):
            raise RequestRefused(403, f"origin {origin[:100]!r} is not in [rpc] allowed_origins")

    def cors_headers(self, request: web.BaseRequest) -> dict[str, str]:
        """CORS response headers for an allowed Origin when ``cors`` is on; none otherwise."""
        origin = request.headers.get("Origin")
        if not self.cors or origin is None or not self.origin_allowed(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Allow-Methods": _CORS_METHODS, "Access-Control-Allow-Headers": _CORS_HEADERS}


class _Connection:
    __slots__ = ("busy", "deadline", "transport")

    def __init__(self, transport: asyncio.Transport, deadline: float):
        self.transport = transport
        self.deadline = deadline   # loop time by which it must be inside a request
        self.busy = 0              # requests in progress on it


class ConnectionGuard:
    """Open-connection cap and header/idle deadlines for one aiohttp ``web.Server``, and the
    websocket pool.

    ``install(server)`` hooks the server's connection callbacks; ``middleware`` marks connections
    busy while a request runs; ``start()``/``stop()`` run the sweeper that closes late connections;
    ``admit_websocket``/``websocket_active``/``websocket_closed`` drive the websocket pool.
    """

    def __init__(self, policy: HttpPolicy):
        self.policy = policy
        self._conns: dict[Any, _Connection] = {}
        self._sweeper: asyncio.Task | None = None
        self.websockets = Pool(PoolLimits(
            total=policy.max_websockets, per_peer=policy.max_websockets_per_client,
            unknown_pool=policy.max_websockets, per_prefix=max(1, policy.max_websockets // 4),
            grace=policy.ws_grace), time.monotonic)
        self._ws_transports: dict[Any, asyncio.Transport] = {}
        self.evicted = 0       # connections closed for making room
        self.timed_out = 0     # connections closed for a late request
        self.refused = 0       # newcomers answered 503
        self.ws_evicted = 0    # websockets closed for making room
        self.ws_timed_out = 0  # websockets closed for being idle
        self.ws_refused = 0    # websocket upgrades refused

    def admit_websocket(self, request: web.BaseRequest) -> str | None:
        """Move ``request``'s connection from the HTTP pool to the websocket pool (evicting if need be);
        the reason it is refused, or None when admitted."""
        key, transport = request.protocol, request.transport
        ip = str(request.remote or "")
        decision = self.websockets.admit(key, ip, ip)
        if not decision.admitted:
            self.ws_refused += 1
            return f"too many websockets: {decision.reason}"
        for victim in decision.evict:
            self.ws_evicted += 1
            victim_transport = self._ws_transports.pop(victim, None)
            if victim_transport is not None:
                victim_transport.abort()
        self._conns.pop(key, None)                      # no longer counts against plain HTTP
        if isinstance(transport, asyncio.Transport):
            self._ws_transports[key] = transport
        return None

    def websocket_active(self, request: web.BaseRequest) -> None:
        self.websockets.touch(request.protocol)

    def websocket_closed(self, request: web.BaseRequest) -> None:
        self.websockets.release(request.protocol)
        self._ws_transports.pop(request.protocol, None)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def install(self, server: web.Server) -> None:
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport):
            made(handler, transport)
            self._opened(handler, transport)

        def connection_lost(handler, exc=None):
            self._conns.pop(handler, None)
            lost(handler, exc)

        server.connection_made = connection_made   # type: ignore[method-assign]
        server.connection_lost = connection_lost   # type: ignore[method-assign]

    def _opened(self, handler, transport: asyncio.Transport) -> None:
        now = asyncio.get_running_loop().time()
        if len(self._conns) >= self.policy.max_connections:
            victim = min((c for c in self._conns.values() if not c.busy), key=lambda c: c.deadline, default=None)
            if victim is None:
                self.refused += 1
                transport.write(_BUSY_RESPONSE)
                transport.close()
                return
            self.evicted += 1
            victim.transport.abort()
            self._conns = {h: c for h, c in self._conns.items() if c is not victim}
        self._conns[handler] = _Connection(transport, now + self.policy.header_timeout)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        conn = self._conns.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.busy += 1
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            conn.deadline = asyncio.get_running_loop().time() + self.policy.idle_timeout

    def start(self) -> None:
        interval = max(0.05, min(1.0, self.policy.header_timeout / 4))
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(interval), name="http-connection-guard")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    async def _sweep(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            self.close_late(loop.time())

            self.close_idle_websockets(time.monotonic())

    def close_late(self, now: float) -> int:
        """Close every connection not inside a request past its deadline; how many were closed."""
        late = [(h, c) for h, c in self._conns.items() if not c.busy and now > c.deadline]
        for handler, conn in late:
            self._conns.pop(handler, None)
            conn.transport.abort()
        self.timed_out += len(late)
        return len(late)

    def close_idle_websockets(self, now: float) -> int:
        """Close every websocket without a message either way for ``ws_idle_timeout``; how many."""
        idle = self.websockets.idle_since(now, self.policy.ws_idle_timeout)
        for key in idle:
            self.websockets.release(key)
            transport = self._ws_transports.pop(key, None)
            if transport is not None:
                transport.abort()
        self.ws_timed_out += len(idle)
        return len(idle)

"""An upgraded connection to a peer and the negotiated streams on it.

``Connection`` wraps one noise-secured, yamux-multiplexed connection or one QUIC session (its
own TLS and streams, node/p2p/quic_transport.py), shared control connection or a dedicated bulk
one; ``HostStream`` is a yamux or QUIC stream after multistream negotiation, with
``protocol``, ``remote_peer`` and ``connection`` added and any bytes read past the negotiation
served first. The Host creates both; users get them from ``open_stream``/handlers.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from .limited import LimitedConnectionError, LimitLike, allowed_on_limited, describe_limit, is_limited
from .multiaddr import Multiaddr
from .muxer import MuxedConnection, YamuxStream
from .negotiate import select_protocol
from .quic_stream import QuicStream
from .quic_transport import QuicSession
from .secure_conn import SecureConn
from .traffic import Traffic


class HostStream:
    """A negotiated stream: the yamux stream's API plus ``protocol`` and ``remote_peer``."""

    def __init__(self, stream: YamuxStream | QuicStream, connection: Connection) -> None:
        self._stream = stream
        self.connection = connection
        self.remote_peer = connection.remote_peer
        self.protocol: str | None = None
        self._pushback = b""

    def _unread(self, data: bytes) -> None:
        self._pushback = data + self._pushback

    async def read(self, n: int = -1) -> bytes:
        if self._pushback:
            if n < 0 or n >= len(self._pushback):
                data, self._pushback = self._pushback, b""
            else:
                data, self._pushback = self._pushback[:n], self._pushback[n:]
            return data
        data = await self._stream.read(n)
        self.connection.count("in", len(data), self.protocol)
        return data

    async def readexactly(self, n: int) -> bytes:
        if not self._pushback:
            data = await self._stream.readexactly(n)
            self.connection.count("in", n, self.protocol)
            return data
        head = await self.read(n)
        if len(head) == n:
            return head
        try:
            tail = await self._stream.readexactly(n - len(head))
            self.connection.count("in", len(tail), self.protocol)
            return head + tail
        except asyncio.IncompleteReadError as exc:
            raise asyncio.IncompleteReadError(head + exc.partial, n) from None

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.write(data)
        self.connection.count("out", len(data), self.protocol)

    async def close(self) -> None:
        await self._stream.close()

    def reset(self) -> None:
        self._stream.reset()

    @property
    def going_away(self) -> asyncio.Event | None:
        """Set once the connection under this stream takes no new streams (it is being retired)."""
        return self.connection.going_away


class Connection:
    """One upgraded connection to a peer (shared control connection or a bulk one)."""

    def __init__(self, secure: SecureConn | QuicSession, direction: str, bulk: bool, negotiate_timeout: float,
                 traffic: Traffic | None = None) -> None:
        self.secure = secure
        self.remote_peer = secure.remote_peer
        self.direction = direction  # "inbound" | "outbound"
        self.bulk = bulk
        peer = secure.tcp.peername
        self.quic = isinstance(secure, QuicSession)  # its own streams: ``muxed`` is the session itself
        make_addr = Multiaddr.from_quic if self.quic else Multiaddr.from_tcp
        self.remote_addr = make_addr(peer[0], peer[1]) if peer else None
        self.muxed: MuxedConnection | QuicSession | None = None
        self._negotiate_timeout = negotiate_timeout
        self.limit: LimitLike | None = None  # a relay's cap on the circuit under us (node/p2p/limited.py)
        self.last_active = time.monotonic()  # when a stream was last opened either way (eviction order)
        self.traffic = traffic

    @property
    def relayed(self) -> bool:
        """A circuit through a relay (its pipe has no IP endpoint), not a direct TCP connection."""
        return self.remote_addr is None

    def count(self, direction: str, n: int, protocol: str | None) -> None:
        if self.traffic is not None:
            self.traffic.add(protocol, direction, self.relayed, n)

    def touch(self) -> None:
        self.last_active = time.monotonic()

    @property
    def limited(self) -> bool:
        """A relayed circuit with a data or duration cap: signalling protocols only."""
        return is_limited(self.limit)

    @property
    def closed(self) -> bool:
        return self.secure.is_closed or (self.muxed is not None and self.muxed.closed)

    @property
    def num_streams(self) -> int:
        return self.muxed.num_streams if self.muxed else 0

    @property
    def going_away(self) -> asyncio.Event | None:
        """Set once either side sent GoAway (None before the upgrade): the connection takes no new
        streams and closes once its streams finish."""
        return self.muxed.going_away if self.muxed is not None else None

    async def open_stream(self, protocol: str | Sequence[str]) -> HostStream:
        """Open a stream and negotiate the first of ``protocol`` the remote supports."""
        protocols = [protocol] if isinstance(protocol, str) else list(protocol)
        if self.limited:
            protocols = [p for p in protocols if allowed_on_limited(p)]
            if not protocols:
                raise LimitedConnectionError(
                    f"{protocol} not allowed on the limited relayed connection to {self.remote_peer} "
                    f"(relay limit: {describe_limit(self.limit)}); it needs a direct connection or "
                    f"an unlimited relay", self.limit)
        stream = HostStream(await self._muxed().open_stream(), self)
        self.touch()
        try:
            stream.protocol = await select_protocol(stream.read, stream.write, stream._unread, protocols,
                                                    self._negotiate_timeout)
        except BaseException:
            stream.reset()
            raise
        return stream

    async def ping(self) -> float:
        return await self._muxed().ping()

    def _muxed(self) -> MuxedConnection | QuicSession:
        if self.muxed is None:
            raise ConnectionError("connection not multiplexed yet")
        return self.muxed

    async def close(self) -> None:
        if self.muxed is not None:
            with contextlib.suppress(Exception):
                await self.muxed.close()
        await self.secure.close()

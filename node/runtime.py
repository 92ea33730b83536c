"""The Node: one asyncio process holding identity, config, RPC/HTTP server and roles.

``Node.run()`` starts the HTTP server, then runs every role in one asyncio.TaskGroup until
``request_stop()`` (wired to SIGINT/SIGTERM by ``run_until_signalled``) or until a role fails;
either way every task is cancelled and every server closed before it returns. ``run_node()`` is
the process entry point: uvloop, signal handlers, exit code.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvloop

from node.artifacts import ArtifactService
from node.bandwidth import BandwidthService
from node.config import Config
from node.dashboard import Dashboard
from node.identity import Identity
from node.ledger import LedgerGateway
from node.metrics import Registry
from node.node_metrics import register_node_metrics
from node.p2p.host import Host
from node.p2p.limits import HostLimits
from node.p2p.multiaddr import Multiaddr
from node.plugins import installed
from node.roles import Role, RoleFactory, RoleStartError, create_service, role_factory
from node.rpc.dispatcher import Dispatcher
from node.rpc.limits import HttpPolicy
from node.rpc.pubsub import Hub
from node.rpc.server import BUILTIN_PATHS, HttpServer, JsonGet
from node.rpc.status import StatusBoard
from node.staked import follow_stakes

log = logging.getLogger(__name__)

BOOTSTRAP_WARN_AFTER = 3  # failed dials in a row before a warning (peers start together)
BOOTSTRAP_REDIAL_S = 30.0


def node_version() -> str:
    try:
        return importlib.metadata.version("dekube")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def ledger_urls(config: Config) -> list[str]:
    """The validators' JSON-RPC URLs the ledger gateway uses, in order: ``[ledger] rpc_urls``, then
    the legacy single-URL keys ``[relay] ledger_rpc``, ``[compute] rpc_url``, ``[relay] receipt_rpc``."""
    values = config.as_dict()
    urls = list(values["ledger"]["rpc_urls"])
    urls += [values.get(section, {}).get(key, "") for section, key in
             (("relay", "ledger_rpc"), ("compute", "rpc_url"), ("relay", "receipt_rpc"))]
    return list(dict.fromkeys(url for url in urls if url))


class NodeStartError(Exception):
    """The node could not start (e.g. its HTTP port is taken); the message says why."""


class _StopRequested(Exception):
    """Raised inside the TaskGroup to unwind it when a stop was requested."""


class Node:
    """A running dekube node. Roles reach everything through it:

    ``node.config``, ``node.identity``, ``node.peer_id``, ``node.home``, ``node.data_dir``,
    ``node.rpc`` (Dispatcher: ``register("dkb_x", async_fn)``), ``node.hub`` (pub/sub topics),
    ``node.status`` (``add_section``), ``node.metrics`` (Registry), ``node.host`` (the p2p Host:
    ``set_handler``, ``open_stream``, ``connect``; listening once ``ready`` is set), ``node.http``,
    ``node.ledger`` (the one ledger gateway: reads, ``send``, ``record``, ``subscribe``; ADR 0100),
    ``node.services`` (the bandwidth service and the installed ``node.plugins`` services),
    ``node.relay_client`` (relayed addresses: ``learn_peer(peer_id)``, ``client.relayed_addrs``),
    ``node.artifacts`` (the ArtifactService: ``add_file``, ``fetch``, ``path``; store under ``<data_dir>/artifacts``).

    ``data_dir`` defaults to ``<home>/data`` (None without a home).
    ``roles`` are role names (of the installed ``node.plugins``) or ``RoleFactory``s; the node builds each
    role once its own services exist (docs/adr/0140), in order, then the services.
    ``node.roles`` holds the built roles; ``node.role(name)`` finds one.
    """

    def __init__(self, config: Config, identity: Identity, roles: Sequence[str | RoleFactory], *,
                 home: Path | None = None, data_dir: Path | None = None):
        if not roles:
            raise ValueError("a node needs at least one role")
        self.config = config
        self.identity = identity
        self.peer_id = identity.peer_id
        self.roles: list[Role] = []
        self.home = home
        self.data_dir = data_dir if data_dir is not None else home / "data" if home is not None else None
        self.version = node_version()
        self.metrics = Registry()
        rpc = config["rpc"]
        self.rpc = Dispatcher(max_body_bytes=rpc["max_body_bytes"], max_batch=rpc["max_batch"], metrics=self.metrics)
        self.hub = Hub(queue_limit=rpc["ws_queue"], metrics=self.metrics)
        self.status = StatusBoard(self._base_status)
        p2p = config["p2p"]
        self.host = Host(identity, p2p["listen"], limits=HostLimits(
            max_inbound_connections=p2p["max_connections"], max_outbound_connections=p2p["max_outbound_connections"],
            max_pending_inbound=p2p["max_pending_inbound"],
            max_pending_inbound_per_ip=p2p["max_pending_inbound_per_ip"],
            max_pending_inbound_per_prefix=p2p["max_pending_inbound_per_prefix"],
            max_connections_per_peer=p2p["max_connections_per_peer"]), agent_version=f"dekube/{self.version}")
        for addr in p2p["bootstrap"]:  # never evicted to make room for inbound peers (ADR 0145)
            bootstrap_peer = Multiaddr.parse(addr).peer_id
            if bootstrap_peer is not None:
                self.host.protect(bootstrap_peer, "bootstrap")
        self.http: HttpServer | None = None
        self._json_gets: dict[str, JsonGet] = {}
        self.dashboard = Dashboard()   # the provider page at GET / (node/dashboard); roles add to it
        self.dashboard.sections["node"] = self._dashboard_section
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._started_monotonic: float | None = None
        self.ledger = LedgerGateway(identity, ledger_urls(config), hub=self.hub)
        self.status.add_section("ledger", self.ledger.status)
        self._register_builtins()
        self.artifacts = ArtifactService.for_node(self)  # before the roles: they fetch and add artifacts
        for spec in roles:
            self.roles.append((role_factory(spec) if isinstance(spec, str) else spec)(self))
        self.metrics.gauge("dekube_node_info", "Constant 1, labelled with this node's identity.",
                           ["peer_id", "version", "roles"]) \
            .set(1, peer_id=self.peer_id, version=self.version, roles=",".join(r.name for r in self.roles))
        self.services = {"bandwidth": BandwidthService(self)}
        self.services |= {name: create_service(name, self) for name in installed().services}

    def role(self, name: str) -> Role:
        """The role called ``name`` that this node runs (KeyError if none)."""
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(name)

    @property
    def relay_client(self):
        """The relay client service (circuits and reservations, whatever the roles; ADR 0062)."""
        return self.services.get("relay_client")

    def add_json_get(self, path: str, handler: JsonGet) -> None:
        """Serve ``GET path`` with ``await handler(query_params)`` as JSON; call while building a role.

        Raise ``InvalidParams``/``InvalidInput`` (400), ``ResourceNotFound`` (404) or
        ``ResourceUnavailable`` (503) for a client-visible error.
        """
        if self.ready.is_set():
            raise RuntimeError("HTTP routes must be added before the node starts (when a role is built)")
        if not path.startswith("/") or path in self._json_gets or path in BUILTIN_PATHS:
            raise ValueError(f"cannot add HTTP route {path!r}")
        self._json_gets[path] = handler

    @property
    def uptime(self) -> float:
        return 0.0 if self._started_monotonic is None else time.monotonic() - self._started_monotonic

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Ask ``run()`` to shut down; safe to call more than once, from the event loop thread."""
        if not self._stop.is_set():
            log.info("shutting down")
        self._stop.set()

    async def run(self) -> None:
        """Serve until ``request_stop()``; re-raises (as an ExceptionGroup) if a role fails."""
        self._started_monotonic = time.monotonic()
        try:
            for role in self.roles:  # a role that cannot start stops the node before it listens
                await role.prepare()
            await self._start_servers()
            log.info("node started", extra={"peer_id": self.peer_id, "roles": ",".join(r.name for r in self.roles)})
            self.ready.set()
            try:
                async with asyncio.TaskGroup() as tasks:
                    tasks.create_task(self._wait_for_stop(), name="stop-watch")
                    if self.config.get("p2p", "bootstrap"):
                        tasks.create_task(self._keep_bootstrap_peers(), name="bootstrap")
                    for role in self.roles:
                        tasks.create_task(self._run_role(role), name=f"role-{role.name}")
                    tasks.create_task(self.ledger.run(), name="ledger-gateway")
                    tasks.create_task(follow_stakes(self.host.classes, self.ledger, self.peer_id), name="staked-peers")
                    for name, service in self.services.items():
                        tasks.create_task(service.run(), name=name)
            except* _StopRequested:
                pass
        finally:
            await self._stop_servers()
            log.info("node stopped")

    async def _wait_for_stop(self) -> None:
        await self._stop.wait()
        raise _StopRequested

    async def _run_role(self, role: Role) -> None:
        await role.run()
        log.warning("role finished on its own", extra={"role": role.name})

    async def _keep_bootstrap_peers(self) -> None:
        """Dial every bootstrap peer now, and again whenever it is disconnected."""
        failures: dict[str, int] = {}
        while True:
            for addr in self.config.get("p2p", "bootstrap"):
                peer = Multiaddr.parse(addr).peer_id
                if peer == self.peer_id or (peer is not None and self.host.is_connected(peer)):
                    continue   # a shared bootstrap list names this node too
                try:
                    await self.host.connect(addr)
                    log.info("connected to bootstrap peer", extra={"addr": addr, "attempts": failures.pop(addr, 0) + 1})
                except Exception as exc:  # a dead or misbehaving peer must not stop the node
                    failures[addr] = n = failures.get(addr, 0) + 1
                    error = f"{type(exc).__name__}: {exc}"
                    # peers started together are often not listening yet: quiet until it persists
                    if n < BOOTSTRAP_WARN_AFTER:
                        log.info("bootstrap peer not reachable yet; retrying",
                                 extra={"addr": addr, "error": error, "retry_s": BOOTSTRAP_REDIAL_S})
                    elif n == BOOTSTRAP_WARN_AFTER or n % 20 == 0:
                        log.warning("bootstrap dial failed", extra={"addr": addr, "error": error, "attempts": n})
            await asyncio.sleep(BOOTSTRAP_REDIAL_S)

    async def _dashboard_section(self) -> dict[str, Any]:
        connections: dict[str, bool] = {}
        for conn in self.host.connections():
            if not conn.closed:   # a peer counts as direct when any of its connections is
                connections[conn.remote_peer] = connections.get(conn.remote_peer, True) and conn.relayed
        return {"peer_id": self.peer_id, "roles": [r.name for r in self.roles], "uptime_s": round(self.uptime, 1),
                "peers": [{"peer_id": p, "relayed": relayed} for p, relayed in sorted(connections.items())]}

    def peers(self) -> list[str]:
        """Peer IDs with an open connection."""
        return sorted({conn.remote_peer for conn in self.host.connections() if not conn.closed})

    async def _start_servers(self) -> None:
        try:
            await self.host.start()
        except OSError as exc:
            raise NodeStartError(
                f"cannot listen on {', '.join(self.config.get('p2p', 'listen'))}: {exc.strerror or exc}") from None
        log.info("p2p listening", extra={"addrs": " ".join(self.host.listen_addrs)})
        rpc = self.config["rpc"]
        if rpc["enabled"]:
            http = HttpServer(dispatcher=self.rpc, hub=self.hub, status=self.status, metrics=self.metrics,
                              host=rpc["host"], port=rpc["port"], json_gets=self._json_gets,
                              policy=HttpPolicy.from_config(rpc), dashboard=self.dashboard)
            try:
                await http.start()
            except OSError as exc:
                await http.stop()
                raise NodeStartError(f"cannot serve HTTP on {http.url}: {exc.strerror or exc}") from None
            self.http = http

    async def _stop_servers(self) -> None:
        self.hub.close()
        if self.http is not None:
            await self.http.stop()
        await self.host.stop()
        self.artifacts.close()

    def _base_status(self) -> dict[str, Any]:
        return {
            "peer_id": self.peer_id,
            "roles": [r.name for r in self.roles],
            "version": self.version,
            "uptime_s": round(self.uptime, 3),
            "listen_addrs": self.host.listen_addrs,
            "peers": self.peers(),
            "rpc_url": self.http.url if self.http is not None else None,
            "chain_id": self.config.get("consensus", "chain_id"),
        }

    def _register_builtins(self) -> None:
        async def dkb_version() -> str:
            return self.version

        async def dkb_peer_id() -> str:
            return self.peer_id

        async def dkb_health() -> dict[str, Any]:
            return {"ok": True, "uptime_s": round(self.uptime, 3)}

        async def dkb_peers() -> list[str]:
            return self.peers()

        self.rpc.register("dkb_version", dkb_version)
        self.rpc.register("dkb_peers", dkb_peers)
        self.rpc.register("dkb_peerId", dkb_peer_id)
        self.rpc.register("dkb_health", dkb_health)
        register_node_metrics(self)


async def run_until_signalled(node: Node) -> int:
    """Run ``node`` with SIGINT/SIGTERM mapped to a clean stop (a second signal exits at once)."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if node.stopping:
            log.warning("second signal: exiting without clean shutdown")
            os._exit(128 + signum)
        node.request_stop()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await node.run()
    except (NodeStartError, RoleStartError) as exc:
        log.error("%s", exc)
        return 1
    except ExceptionGroup as group:
        leaves = _leaves(group)
        if not all(isinstance(leaf, (NodeStartError, RoleStartError)) for leaf in leaves):
            log.exception("node failed")
            return 1
        for leaf in leaves:  # a role's run() could not start it: one line each, no traceback
            log.error("%s", leaf)
        return 1
    except Exception:
        log.exception("node failed")
        return 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return 0


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    return [leaf for exc in group.exceptions
            for leaf in (_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])]


def run_node(node_factory: Callable[[], Node]) -> int:
    """Process entry point: build the node inside a uvloop event loop and run it until signalled."""

    async def main() -> int:
        return await run_until_signalled(node_factory())

    return uvloop.run(main())

"""The Host: listens and dials TCP and QUIC, upgrades connections and routes streams to handlers.

Upgrade: TCP -> multistream ``/noise`` -> noise XX (peer ID checked when dialing) ->
multistream ``/yamux/1.0.0`` -> ``MuxedConnection``. Each new stream is negotiated with
multistream and handed to the handler set for its protocol as a ``HostStream`` (which adds
``protocol``, ``remote_peer`` and ``connection``). One shared connection per peer carries
control traffic (concurrent dials are coalesced); ``open_bulk_connection`` opens a dedicated one
for bulk data. Identify runs on each new shared connection and fills the peer book. Every task is
tracked and cancelled on ``stop``; an error on one connection closes only that connection.

QUIC (``/ip4|ip6/.../udp/PORT/quic-v1`` listen addresses, node/p2p/quic_transport.py, ADR 0222)
needs no upgrade: a verified QUIC session is registered as a Connection whose streams are QUIC
streams, negotiated with multistream and handed to the same handlers; QUIC dials leave from a QUIC
listening socket of the same address family when there is one (the port a hole punch opened);
``dial_quic`` makes a new QUIC connection beside any others to the peer (the QUIC hole punch,
relay/quic_punch.py, ADR 0228).

Relayed connections use two public hooks. ``upgrade(pipe, ...)`` secures and registers any
TcpConnection-shaped byte pipe (a circuit stream). ``register_circuit_dialer(fn)`` lets ``connect``,
``open_stream`` and ``open_bulk_connection`` dial ``.../p2p/RELAY/p2p-circuit/p2p/TARGET``
addresses: the Host calls ``await fn(maddr, bulk)``, which must return a Connection registered
through ``upgrade`` (the relay client's ``dial``). Which address is tried when is dial_race.py's
ranking: direct ones staggered, relayed ones held back while a direct one may still work, and
tried in the order ``register_relay_ranking(fn)`` gives them (the relay client: least loaded relay first).

Admission (node/p2p/resources.py, ADR 0145, 0186): pending inbound sockets are a scoped pool
(node/admission.py): capped in all, per source IP and per address prefix, a full pool evicting the
oldest pending socket of the most-represented prefix rather than refusing the newcomer, sockets from
a known address of a protected peer (the committee) admitted always. Inbound and outbound
connections have separate budgets; at the inbound cap a new authenticated connection evicts the
longest-idle inbound connection of a peer not protected with ``protect(peer_id, tag)`` (the
validator role protects the committee, the runtime bootstrap peers).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from node.admission import PeerClass, PeerClasses
from node.identity import Identity

from .connection import Connection, HostStream
from .dial_race import AllDialsFailed, DialAttempt, race
from .errors import HandshakeTimeout, ProtocolError
from .identify import MAX_IDENTIFY_BYTES, IdentifyInfo, decode_identify, encode_identify
from .identify import PROTOCOL_ID as IDENTIFY_PROTOCOL
from .limited import LimitLike, allowed_on_limited
from .limits import HostLimits
from .multiaddr import Multiaddr
from .muxer import MuxedConnection, MuxerClosedError, YamuxStream
from .negotiate import accept_protocol, select_protocol
from .noise import PROTOCOL_ID as NOISE_PROTOCOL
from .noise import generate_static_keypair
from .peerbook import PeerBook
from .ping import PROTOCOL_ID as PING_PROTOCOL
from .ping import ping_once, serve_ping
from .quic_stream import QuicStream
from .quic_transport import QuicEndpoint, QuicSession, QuicTls
from .resources import Protector, pending_pool, pick_victim
from .secure_conn import BytePipe, SecureConn, TcpConnection, secure_connection
from .traffic import Traffic
from .yamux import WindowTuner

__all__ = ["CircuitDialer", "Connection", "DialError", "Handler", "Host", "HostStream", "YAMUX_PROTOCOL",
           "advertised_addrs"]  # Connection and HostStream are re-exported from .connection

YAMUX_PROTOCOL = "/yamux/1.0.0"
_ADDRESS_FAMILY = {"ip4": socket.AF_INET, "dns4": socket.AF_INET, "ip6": socket.AF_INET6, "dns6": socket.AF_INET6}
log = logging.getLogger(__name__)
IP_CLASS_CACHE_S = 1.0       # how long the address -> class map of known peers is reused
KNOWN_ADDRS_PER_PEER = 4     # direct addresses of a tagged (non-committee) peer that give its class

Handler = Callable[["HostStream"], Awaitable[None]]
CircuitDialer = Callable[[Multiaddr, bool], Awaitable[Connection]]
# one dial of a race: gets ``reached()`` and yields a secured TCP connection or a registered circuit
_Attempt = Callable[[Callable[[], None]], Awaitable["SecureConn | QuicSession | Connection"]]


def advertised_addrs(bound: Sequence[Multiaddr], local_ip: str | None) -> list[Multiaddr]:
    """Listen addresses as a peer can dial them: a wildcard host (0.0.0.0, ::) is replaced by the
    local IP that peer reached us on (same address family), or left out when unknown."""
    out = []
    for addr in bound:
        host, port = addr.direct_endpoint()
        if host not in ("0.0.0.0", "::"):
            out.append(addr)
        elif local_ip is not None and (":" in local_ip) == (host == "::"):
            out.append((Multiaddr.from_quic if addr.is_quic else Multiaddr.from_tcp)(local_ip, port))
    return out


class DialError(ConnectionError):
    """No connection could be made to a peer (no address, refused, handshake failed)."""


class Host:
    def __init__(self, identity: Identity, listen_addrs: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",), *,
                 limits: HostLimits | None = None, agent_version: str = "dekube/0.1.0",
                 muxer_options: dict[str, Any] | None = None) -> None:
        self.identity = identity
        self.peer_id = identity.peer_id
        self.limits = limits or HostLimits()
        self.peerbook = PeerBook()
        self.traffic = Traffic()  # stream bytes by protocol, direction, direct/relayed
        self._agent_version = agent_version
        self._muxer_options = muxer_options or {}
        self._requested_addrs = [Multiaddr.parse(a) for a in listen_addrs]
        self._static_keypair = generate_static_keypair()
        # one auto-tuning state for all connections: flows through one bottleneck get equal windows
        self._window_tuner = WindowTuner(self.limits.receive_window_budget)
        self._handlers: dict[str, Handler] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._quic_tls: QuicTls | None = None            # made on first QUIC use
        self._quic_listeners: list[QuicEndpoint] = []
        self._quic_dialers: dict[bool, QuicEndpoint] = {}  # ipv6? -> a dial-only socket
        self._bound_addrs: list[Multiaddr] = []
        self._shared: dict[str, Connection] = {}
        self._connections: set[Connection] = set()
        self._dials: dict[str, asyncio.Future[Connection]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._upgrading: set[TcpConnection] = set()  # inbound sockets still being upgraded
        self._pending = pending_pool(self.limits, time.monotonic)
        self._protector = Protector()
        self.classes = PeerClasses()  # staked peers, a task's crew...: tagged by the roles that know them
        self._ip_class_cache: tuple[float, int, dict[str, PeerClass]] | None = None
        self._circuit_dialer: CircuitDialer | None = None
        self._relay_ranking: Callable[[list[Multiaddr]], list[Multiaddr]] | None = None
        self._extra_addrs: dict[str, Callable[[], Sequence[str]]] = {}   # source -> provider
        self._running = False
        self.set_handler(IDENTIFY_PROTOCOL, self._serve_identify)
        self.set_handler(PING_PROTOCOL, serve_ping)

    # ---- lifecycle
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._running = True
        for addr in self._requested_addrs:
            if addr.is_quic:
                await self._listen_quic(addr)
                continue
            host, port = addr.tcp_endpoint()
            server = await loop.create_server(self._inbound_protocol, host, port, reuse_address=True)
            self._servers.append(server)
            for sock in server.sockets:
                bound_host, bound_port = sock.getsockname()[:2]
                self._bound_addrs.append(Multiaddr.from_tcp(bound_host, bound_port))

    async def stop(self) -> None:
        self._running = False
        for server in self._servers:
            server.close()
        for tcp in list(self._upgrading):  # also those whose upgrade task has not started yet
            tcp.abort()
        self._upgrading.clear()
        for holder in self._pending.holders():
            self._pending.release(holder.key)
        await asyncio.gather(*(conn.close() for conn in list(self._connections)), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._servers.clear()
        endpoints = self._quic_listeners + list(self._quic_dialers.values())
        await asyncio.gather(*(e.close() for e in endpoints), return_exceptions=True)
        self._quic_listeners.clear()
        self._quic_dialers.clear()
        self._connections.clear()
        self._shared.clear()

    async def __aenter__(self) -> Host:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def listen_addrs(self) -> list[str]:
        return [str(a.with_peer_id(self.peer_id)) for a in self._bound_addrs]

    def set_handler(self, protocol: str, handler: Handler) -> None:
        self._handlers[protocol] = handler

    def remove_handler(self, protocol: str) -> None:
        self._handlers.pop(protocol, None)

    def register_circuit_dialer(self, dialer: CircuitDialer | None) -> None:
        """Dial relayed addresses with ``await dialer(maddr, bulk)`` (None: relayed addresses fail).

        ``maddr`` is the full ``<relay addr>/p2p/RELAY/p2p-circuit/p2p/TARGET``; ``bulk`` asks for a
        dedicated connection (``open_bulk_connection``). The dialer returns a Connection to TARGET
        that it registered with ``Host.upgrade`` (so it is shared, deduplicated and closed like any
        other) and raises ConnectionError/OSError/ProtocolError/TimeoutError when it cannot. The
        relay client's is ``lambda maddr, bulk: client.dial([str(maddr)], bulk=bulk)``.
        """
        self._circuit_dialer = dialer

    def register_relay_ranking(self, ranking: Callable[[list[Multiaddr]], list[Multiaddr]] | None) -> None:
        """Order a dial's relayed addresses with ``ranking(addrs)`` (the relay client's: the least loaded
        relay first); None: peer book order."""
        self._relay_ranking = ranking

    def advertise_extra_addrs(self, provider: Callable[[], Sequence[str]] | None, *, source: str = "relay") -> None:
        """Also advertise ``provider()``'s multiaddrs in identify, after the bound listen addresses:
        one provider per ``source`` (None removes it), e.g. the relayed addresses a NAT'd node holds
        reservations for ("relay") and the public address its router maps to it ("port_mapping",
        listed first)."""
        if provider is None:
            self._extra_addrs.pop(source, None)
        else:
            self._extra_addrs[source] = provider

    def extra_addrs(self) -> list[str]:
        """What the ``advertise_extra_addrs`` providers give now, port mappings first."""
        sources = sorted(self._extra_addrs, key=lambda s: s != "port_mapping")
        return [addr for source in sources for addr in self._extra_addrs[source]()]

    def connections(self, peer_id: str | None = None) -> list[Connection]:
        return [c for c in self._connections if peer_id is None or c.remote_peer == peer_id]

    def protect(self, peer_id: str, tag: str) -> None:
        """Never evict ``peer_id``'s connections while any tag protects it."""
        self._protector.protect(peer_id, tag)

    def unprotect(self, peer_id: str, tag: str) -> bool:
        """Drop one tag; True if another tag still protects the peer."""
        return self._protector.unprotect(peer_id, tag)

    def set_protected(self, tag: str, peer_ids: Sequence[str]) -> None:
        """Make exactly ``peer_ids`` protected under ``tag`` (e.g. the current committee)."""
        self._protector.set_tag(tag, peer_ids)

    def is_protected(self, peer_id: str) -> bool:
        return self._protector.is_protected(peer_id)

    def peer_class(self, peer_id: str) -> PeerClass:
        """The admission class of ``peer_id`` (node/admission.py): COMMITTEE for a protected peer."""
        return PeerClass.COMMITTEE if self.is_protected(peer_id) else self.classes.class_of(peer_id)

    def _ip_class(self, ip: str) -> PeerClass:
        """An inbound socket's class before its peer is known: COMMITTEE from a protected peer's address,
        else the class of a tagged peer (staked, business) with that address among its first
        ``KNOWN_ADDRS_PER_PEER`` direct ones in the peer book (a staked peer naming many addresses
        cannot lend its class to a flood from them)."""
        cache = self._ip_class_cache
        if (cache is None or cache[1] != self.classes.version
                or time.monotonic() - cache[0] > IP_CLASS_CACHE_S):
            cache = self._ip_class_cache = (time.monotonic(), self.classes.version, self._known_ips())
        return cache[2].get(ip, PeerClass.UNKNOWN)

    def _known_ips(self) -> dict[str, PeerClass]:
        tagged = self.classes.tagged()
        for peer_id in self._protector.peers():
            tagged[peer_id] = PeerClass.COMMITTEE
        out: dict[str, PeerClass] = {}
        for peer_id, cls in tagged.items():
            direct = [addr for addr in self.peerbook.addrs(peer_id)
                      if not addr.is_relayed and addr.parts[0][0] in ("ip4", "ip6")]
            limit = None if cls == PeerClass.COMMITTEE else KNOWN_ADDRS_PER_PEER
            for addr in direct[:limit]:
                ip = addr.parts[0][1]
                out[ip] = max(cls, out.get(ip, PeerClass.UNKNOWN))
        return out

    def _count(self, direction: str) -> int:
        return sum(1 for c in self._connections if c.direction == direction)

    def is_connected(self, peer_id: str) -> bool:
        conn = self._shared.get(peer_id)
        return conn is not None and not conn.closed

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- QUIC
    def _quic(self) -> QuicTls:
        if self._quic_tls is None:
            self._quic_tls = QuicTls(self.identity)
        return self._quic_tls

    async def _listen_quic(self, addr: Multiaddr) -> None:
        host, port = addr.quic_endpoint()
        endpoint = await QuicEndpoint.open(
            host, port, self._quic(), self._on_quic_inbound,
            handshake_timeout=min(self.limits.handshake_timeout, self.limits.inbound_handshake_timeout),
            max_pending=self.limits.max_pending_inbound)
        self._quic_listeners.append(endpoint)
        bound = endpoint.sockname
        assert bound is not None
        self._bound_addrs.append(Multiaddr.from_quic(bound[0], bound[1]))

    def _on_quic_inbound(self, session: QuicSession) -> None:
        if not self._running:
            session.abort("host stopping")
            return
        async def register() -> None:
            with contextlib.suppress(DialError):
                await self._register(session, "inbound", bulk=False)
        self._spawn(register())

    async def _quic_endpoint_for(self, ip: str) -> QuicEndpoint:
        """The socket to dial ``ip`` from: a listener of its family that can reach it, else a
        dial-only socket on an ephemeral port."""
        ipv6 = ":" in ip
        listener = self.quic_listener_for(ip)
        if listener is not None:
            return listener
        dialer = self._quic_dialers.get(ipv6)
        if dialer is None or dialer.transport is None:
            dialer = await QuicEndpoint.open("::" if ipv6 else "0.0.0.0", 0, self._quic())
            self._quic_dialers[ipv6] = dialer
        return dialer

    async def _dial_quic(self, peer_id: str, addr: Multiaddr,
                         reached: Callable[[], None] | None = None) -> QuicSession:
        """A verified QUIC session: no answer within ``connect_timeout`` fails like a TCP connect
        (``reached`` once one comes), the whole handshake within ``handshake_timeout``."""
        ip, port = addr.quic_endpoint()
        endpoint = await self._quic_endpoint_for(ip)
        return await endpoint.dial((ip, port), peer_id, self.limits.handshake_timeout,
                                   answer_timeout=min(self.limits.connect_timeout, self.limits.handshake_timeout),
                                   on_answer=reached)

    def quic_listener_for(self, ip: str) -> QuicEndpoint | None:
        """The listening QUIC socket that dials ``ip`` (the one whose mapping a relay observes and a
        hole punch reuses), or None when no QUIC listener can reach it: one of its family bound to
        the wildcard, to loopback for a loopback ``ip``, or to another address for any other."""
        ipv6 = ":" in ip
        loopback = ip.startswith("127.") or ip == "::1"
        for endpoint in self._quic_listeners:
            bound = endpoint.sockname
            if bound is None or (":" in bound[0]) != ipv6:
                continue
            bound_loopback = bound[0].startswith("127.") or bound[0] == "::1"
            if bound[0] in ("0.0.0.0", "::") or loopback == bound_loopback:
                return endpoint
        return None

    async def dial_quic(self, peer_id: str, addr: Multiaddr, *, answer_timeout: float) -> Connection:
        """A new QUIC connection to ``peer_id`` at ``addr``, beside any it has (a relay's QUIC observed
        address, a hole punch's QUIC dial), from the QUIC listener that reaches it: ConnectionError
        when nothing answers within ``answer_timeout``."""
        ip, port = addr.quic_endpoint()
        endpoint = self.quic_listener_for(ip)
        if endpoint is None:
            raise DialError(f"no QUIC listener to dial {addr} from")
        session = await endpoint.dial((ip, port), peer_id, self.limits.handshake_timeout,
                                      answer_timeout=answer_timeout)
        return await self._register(session, "outbound", bulk=False)

    # ---- inbound
    def _inbound_protocol(self) -> TcpConnection:
        tcp = TcpConnection()
        tcp.connected.add_done_callback(lambda _f: self._on_tcp_accepted(tcp))
        return tcp

    def _on_tcp_accepted(self, tcp: TcpConnection) -> None:
        # a full inbound budget is no reason to refuse here: the new peer may evict an idle one
        peer = tcp.peername
        ip = peer[0] if peer else ""
        if not self._running:
            tcp.abort()
            return
        decision = self._pending.admit(tcp, ip, ip, self._ip_class(ip))
        for victim in decision.evict:  # oldest pending sockets of the most-represented prefix
            assert isinstance(victim, TcpConnection)
            self._upgrading.discard(victim)
            victim.abort()
        if not decision.admitted:
            log.debug("inbound socket from %s refused: %s", ip, decision.reason)
            tcp.abort()
            return
        self._upgrading.add(tcp)
        self._spawn(self._handle_inbound(tcp))

    async def _handle_inbound(self, tcp: TcpConnection) -> None:
        try:
            try:
                secure = await self._secure(tcp, is_initiator=False, expected_peer=None,
                                            timeout=min(self.limits.handshake_timeout,
                                                        self.limits.inbound_handshake_timeout))
            finally:
                self._upgrading.discard(tcp)
                self._pending.release(tcp)
        except (ProtocolError, OSError, TimeoutError) as exc:
            log.debug("inbound upgrade from %s failed: %s", tcp.peername, exc)
            tcp.abort()
            return
        except BaseException:  # cancelled by stop(): never leave the socket open
            tcp.abort()
            raise
        with contextlib.suppress(DialError):
            await self._register(secure, "inbound", bulk=False)

    # ---- the upgrade, for TCP and for any other byte pipe (relayed circuits)
    async def _secure(self, pipe: BytePipe, *, is_initiator: bool, expected_peer: str | None,
                      timeout: float | None = None) -> SecureConn:
        """multistream /noise -> noise XX -> multistream /yamux/1.0.0, within the handshake timeout."""
        timeout = self.limits.handshake_timeout if timeout is None else timeout
        negotiate = select_protocol if is_initiator else accept_protocol

        async def raw_write(data: bytes) -> None:
            pipe.write(data)
            await pipe.drain()

        try:
            async with asyncio.timeout(timeout):
                await negotiate(pipe.read, raw_write, pipe.unread, [NOISE_PROTOCOL], timeout)
                secure = await secure_connection(pipe, self.identity, is_initiator, expected_peer,
                                                 self._static_keypair, timeout)
                await negotiate(secure.read, secure.write, secure.unread, [YAMUX_PROTOCOL], timeout)
        except TimeoutError as exc:
            raise HandshakeTimeout(f"connection upgrade took longer than {timeout} s") from exc
        return secure

    async def upgrade(self, pipe: BytePipe, *, is_initiator: bool, expected_peer: str | None = None,
                      bulk: bool = False, limit: LimitLike | None = None) -> Connection:
        """Secure and multiplex any ordered byte pipe and register it like a TCP connection.

        ``pipe`` has TcpConnection's shape (``read``, ``read_chunks``, ``unread``, ``write``,
        ``drain``, ``close``, ``abort``, ``is_closed``, ``connection_lost_callbacks``,
        ``peername``, ``sockname``); the relay client uses this for circuits. The dialing side
        names the peer it expects; ``limit`` is the relay's cap on the circuit (the connection is
        then ``limited``: signalling protocols only, node/p2p/limited.py). On failure the pipe is
        aborted and the error (ProtocolError, OSError, DialError for limits) propagates.
        """
        try:
            secure = await self._secure(pipe, is_initiator=is_initiator, expected_peer=expected_peer)
        except BaseException:
            pipe.abort()
            raise
        return await self._register(secure, "outbound" if is_initiator else "inbound", bulk=bulk, limit=limit)

    # ---- outbound
    async def _dial_tcp(self, addr: Multiaddr) -> TcpConnection:
        host, port = addr.tcp_endpoint()
        family = _ADDRESS_FAMILY.get(addr.parts[0][0], socket.AF_UNSPEC)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(min(self.limits.connect_timeout, self.limits.handshake_timeout)):
            _transport, tcp = await loop.create_connection(TcpConnection, host, port, family=family)
        return tcp

    async def _dial(self, peer_id: str, addrs: Sequence[Multiaddr], bulk: bool) -> Connection:
        if not self._running:
            raise DialError("host is not running")
        if self._count("outbound") >= self.limits.max_outbound_connections:
            raise DialError("outbound connection limit reached")
        if len(self.connections(peer_id)) >= self.limits.max_connections_per_peer:
            raise DialError(f"per-peer connection limit reached for {peer_id}")
        if peer_id == self.peer_id:
            raise DialError("refusing to dial ourselves")
        relayed = [a for a in addrs if a.is_relayed]
        if self._relay_ranking is not None and len(relayed) > 1:
            addrs = [a for a in addrs if not a.is_relayed] + self._relay_ranking(relayed)
        attempts = [DialAttempt(str(addr), addr.is_relayed, self._direct_attempt(peer_id, addr)
                                if not addr.is_relayed else self._circuit_attempt(peer_id, addr, bulk),
                                (ProtocolError, OSError, TimeoutError)) for addr in addrs]
        try:
            won = await race(attempts, self._discard_dialed)
        except AllDialsFailed as exc:
            raise DialError(f"could not dial {peer_id}: {exc}") from None
        if isinstance(won, Connection):  # a circuit, registered by the dialer
            return won
        return await self._register(won, "outbound", bulk=bulk)

    def _direct_attempt(self, peer_id: str, addr: Multiaddr) -> _Attempt:
        if addr.is_quic:
            async def quic_attempt(reached: Callable[[], None]) -> QuicSession:
                return await self._dial_quic(peer_id, addr, reached)
            return quic_attempt

        async def attempt(reached: Callable[[], None]) -> SecureConn:
            tcp = None
            try:
                tcp = await self._dial_tcp(addr)
                reached()
                return await self._secure(tcp, is_initiator=True, expected_peer=peer_id)
            except BaseException:
                if tcp is not None:
                    tcp.abort()
                raise
        return attempt

    def _circuit_attempt(self, peer_id: str, addr: Multiaddr, bulk: bool) -> _Attempt:
        async def attempt(reached: Callable[[], None]) -> Connection:
            return await self._dial_circuit(peer_id, addr, bulk)
        return attempt

    @staticmethod
    async def _discard_dialed(surplus: SecureConn | QuicSession | Connection) -> None:
        """A dial that also succeeded after another address won the race."""
        await surplus.close()

    async def _dial_circuit(self, peer_id: str, addr: Multiaddr, bulk: bool) -> Connection:
        if self._circuit_dialer is None:
            raise DialError("no circuit dialer registered for relayed addresses")
        conn = await self._circuit_dialer(addr.with_peer_id(peer_id), bulk)
        if conn.remote_peer != peer_id:
            await conn.close()
            raise DialError(f"the circuit dialer reached {conn.remote_peer}, not {peer_id}")
        if conn not in self._connections:  # not registered through upgrade(), or already lost
            await conn.close()
            raise DialError("the circuit dialer returned no live connection registered with this host")
        return conn

    def _known_addrs(self, peer_id: str) -> list[Multiaddr]:
        """The peer book's addresses of ``peer_id``, TCP before QUIC (stable otherwise): the dial race
        staggers them in this order, and TCP moves bulk data far faster here (QUIC is for the
        paths only UDP gets through; ADR 0222)."""
        return sorted(self.peerbook.addrs(peer_id), key=lambda a: a.is_quic)

    async def connect(self, multiaddr: str) -> str:
        """Connect to ``/ip4/.../tcp/.../p2p/<id>`` or a relayed ``.../p2p-circuit/p2p/<id>`` address
        (reusing a live connection); return the peer ID."""
        addr = Multiaddr.parse(multiaddr)
        peer_id = addr.peer_id
        if peer_id is None:
            raise ValueError(f"multiaddr needs a /p2p/<peer id> suffix: {multiaddr}")
        self.peerbook.add_addrs(peer_id, [addr])
        await self._shared_connection(peer_id, [addr.without_peer_id()])
        return peer_id

    async def _shared_connection(self, peer_id: str, addrs: Sequence[Multiaddr] | None = None) -> Connection:
        conn = self._shared.get(peer_id)
        if conn is not None and not conn.closed:
            return conn
        pending = self._dials.get(peer_id)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._dials[peer_id] = pending
            try:
                conn = await self._dial(peer_id, addrs if addrs is not None else self._known_addrs(peer_id), False)
            except BaseException as exc:
                if not pending.done():
                    pending.set_exception(exc if isinstance(exc, Exception) else DialError("dial cancelled"))
                    pending.exception()  # mark retrieved: waiters re-raise it themselves
                raise
            finally:
                self._dials.pop(peer_id, None)
            if not pending.done():
                pending.set_result(conn)
            return conn
        return await asyncio.shield(pending)

    async def open_stream(self, peer_id: str, protocol: str | Sequence[str]) -> HostStream:
        """Open a negotiated stream on the shared connection, dialing from the peer book if needed."""
        conn = await self._shared_connection(peer_id)
        try:
            return await conn.open_stream(protocol)
        except MuxerClosedError:  # the connection died under us (GoAway, peer restart): redial once
            self._forget(conn)
            conn = await self._shared_connection(peer_id)
            return await conn.open_stream(protocol)

    async def open_bulk_connection(self, peer_id: str) -> Connection:
        """A new dedicated connection to ``peer_id`` (not shared) for bulk traffic."""
        addrs = self._known_addrs(peer_id)
        shared = self._shared.get(peer_id)
        # the address that worked for the shared connection goes first, if it is one the peer
        # listens on: a hole-punched mapping is reachable from the punch port only
        if shared is not None and shared.direction == "outbound" and shared.remote_addr in addrs:
            addrs = [shared.remote_addr] + [a for a in addrs if a != shared.remote_addr]
        try:
            return await self._dial(peer_id, addrs, bulk=True)
        except DialError as exc:
            if not any(conn.limited for conn in self.connections(peer_id)):
                raise
            # only a capped circuit reaches the peer: bulk waits for a direct connection (a hole punch
            # over that circuit) rather than failing at once (ADR 0143)
            direct = await self._direct_connection(peer_id, self.limits.bulk_direct_wait)
            if direct is None:
                raise DialError(f"{exc}; no direct connection within {self.limits.bulk_direct_wait:g} s") from None
            punched = direct.remote_addr
            try:
                if punched is not None:
                    return await self._dial(peer_id, [punched] + [a for a in addrs if a != punched], bulk=True)
            except DialError:
                pass
            return direct   # a punched mapping may answer only its own connection: share that one

    async def _direct_connection(self, peer_id: str, wait: float) -> Connection | None:
        """A direct (TCP, not relayed) open connection to ``peer_id``, waiting up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            direct = next((c for c in self.connections(peer_id) if not c.relayed and not c.closed), None)
            if direct is not None or time.monotonic() >= deadline:
                return direct
            await asyncio.sleep(0.1)

    async def ping(self, peer_id: str) -> float:
        """One ping round trip. A ping caught on a connection retired under it (a relayed one closed
        or replaced once a hole punch gave a direct one) is sent again, once, on the new shared
        connection (issue 25)."""
        stream = await self.open_stream(peer_id, PING_PROTOCOL)
        try:
            return await self._ping_on(stream)
        except (ProtocolError, ConnectionError):
            conn = stream.connection
            if not conn.closed and self._shared.get(peer_id) in (None, conn):
                raise
            if conn.closed:
                self._forget(conn)
        return await self._ping_on(await self.open_stream(peer_id, PING_PROTOCOL))

    @staticmethod
    async def _ping_on(stream: HostStream) -> float:
        try:
            return await ping_once(stream)
        finally:
            with contextlib.suppress(ProtocolError, ConnectionError):
                await stream.close()

    # ---- connection registry and stream dispatch
    async def _register(self, secure: SecureConn | QuicSession, direction: str, bulk: bool,
                        limit: LimitLike | None = None) -> Connection:
        peer_id = secure.remote_peer
        conn = Connection(secure, direction, bulk, self.limits.negotiate_timeout, self.traffic)
        conn.limit = limit
        if (len(self.connections(peer_id)) >= self.limits.max_connections_per_peer
                or not self._running or not self._make_room(direction)):
            await secure.close()
            raise DialError(f"connection limit reached for {peer_id}")
        if isinstance(secure, QuicSession):  # QUIC streams are the streams: no yamux
            secure.set_stream_handler(self._stream_handler(conn))
            conn.muxed = secure
        else:
            options = {"max_streams": self.limits.max_streams_per_connection,
                       "window_tuner": self._window_tuner, **self._muxer_options}
            conn.muxed = MuxedConnection(secure, direction == "outbound", self._stream_handler(conn), **options)
        self._connections.add(conn)
        if not bulk:
            current = self._shared.get(peer_id)
            # a direct connection takes new streams from a relayed one (the DCUtR spec: "all new
            # streams should be opened in the direct connection"), so none starts on a circuit
            # about to be retired
            if current is None or current.closed or (current.relayed and not conn.relayed):
                self._shared[peer_id] = conn
        await conn.muxed.start()
        if secure.is_closed:  # lost during the upgrade: its lost-callbacks already ran
            self._forget(conn)
            raise DialError(f"connection to {peer_id} closed during setup")
        secure.tcp.connection_lost_callbacks.append(lambda: self._forget(conn))
        self.peerbook.touch(peer_id)
        if not bulk:
            self._spawn(self._identify(conn))
        return conn

    def _make_room(self, direction: str) -> bool:
        """Whether a new ``direction`` connection fits its budget, evicting an inbound one if need be."""
        if direction == "outbound":
            return self._count("outbound") < self.limits.max_outbound_connections
        while self._count("inbound") >= self.limits.max_inbound_connections:
            victim = pick_victim((c for c in self._connections if c.direction == "inbound"),
                                 self._protector.is_protected, self.classes.class_of)
            if victim is None:  # every inbound peer is protected
                return False
            log.debug("inbound connection limit: evicting %s", victim.remote_peer)
            self._forget(victim)  # closes it in the background
        return True

    def _forget(self, conn: Connection) -> None:
        self._connections.discard(conn)
        if self._shared.get(conn.remote_peer) is conn:
            del self._shared[conn.remote_peer]
            replacement = next((c for c in self._connections
                                if c.remote_peer == conn.remote_peer and not c.bulk and not c.closed), None)
            if replacement is not None:
                self._shared[conn.remote_peer] = replacement
        if conn.muxed is not None and not conn.muxed.closed:
            self._spawn(conn.close())

    def _stream_handler(self, conn: Connection) -> Callable[[YamuxStream | QuicStream], Awaitable[None]]:
        async def on_stream(raw_stream: YamuxStream | QuicStream) -> None:
            stream = HostStream(raw_stream, conn)
            conn.touch()
            try:
                offered = [p for p in self._handlers if not conn.limited or allowed_on_limited(p)]
                stream.protocol = await accept_protocol(stream.read, stream.write, stream._unread,
                                                        offered, self.limits.negotiate_timeout)
            except (ProtocolError, OSError, asyncio.IncompleteReadError) as exc:
                log.debug("stream negotiation with %s failed: %s", conn.remote_peer, exc)
                stream.reset()
                return
            handler = self._handlers.get(stream.protocol)
            if handler is None:
                stream.reset()
                return
            try:
                await handler(stream)
            except asyncio.CancelledError:
                stream.reset()
                raise
            except (ConnectionError, ProtocolError, asyncio.IncompleteReadError) as exc:
                log.debug("stream %s from %s ended: %r", stream.protocol, conn.remote_peer, exc)
                stream.reset()
            except Exception:
                log.exception("handler for %s from %s failed", stream.protocol, conn.remote_peer)
                stream.reset()
        return on_stream

    # ---- identify
    def _identify_info(self, conn: Connection) -> IdentifyInfo:
        local = conn.secure.tcp.sockname
        listen_addrs = advertised_addrs(self._bound_addrs, local[0] if local else None)
        for addr in self.extra_addrs():
            with contextlib.suppress(ProtocolError):  # a malformed extra address is left out
                listen_addrs.append(Multiaddr.parse(addr))
        return IdentifyInfo(public_key=self.identity.public_key_protobuf, listen_addrs=listen_addrs,
                            protocols=list(self._handlers), observed_addr=conn.remote_addr,
                            agent_version=self._agent_version)

    async def _serve_identify(self, stream: HostStream) -> None:
        await stream.write(encode_identify(self._identify_info(stream.connection)))
        await stream.close()

    async def _identify(self, conn: Connection) -> None:
        try:
            async with asyncio.timeout(self.limits.identify_timeout):
                stream = await conn.open_stream(IDENTIFY_PROTOCOL)
                chunks = []
                size = 0
                while True:
                    data = await stream.read()
                    if not data:
                        break
                    size += len(data)
                    if size > MAX_IDENTIFY_BYTES:
                        stream.reset()
                        raise ProtocolError("identify response too large")
                    chunks.append(data)
                await stream.close()
            info = decode_identify(b"".join(chunks))
            if info.peer_id != conn.remote_peer:
                raise ProtocolError("identify public key does not match the connection's peer")
        except Exception as exc:  # identify is best effort: a failure only leaves the peer book stale
            log.debug("identify with %s failed: %s", conn.remote_peer, exc)
            return
        self.peerbook.update_identify(conn.remote_peer, listen_addrs=info.listen_addrs, protocols=info.protocols,
                                      agent_version=info.agent_version, protocol_version=info.protocol_version,
                                      observed_addr=info.observed_addr)

"""The asyncio driver of DCUtR: upgrade a relayed connection to a direct one by TCP hole punching.

A NAT maps one local port to one public port only if the node keeps using that local port, so the
hole puncher owns a *punch port*: ``connect_public(addr)`` connects to a public peer (a relay) from
it and learns, through identify on that connection, the address the NAT maps it to; those observed
addresses are what the dcutr exchange offers. ``direct_connect(relayed)`` runs the initiator side
(``relay/dcutr.py`` times it) up to ``attempts`` times; ``serve`` (the ``/libp2p/dcutr`` handler)
runs the responder side. Both sides dial from the punch port at the agreed moment (simultaneous
open through both NATs), and both also listen on it for the punch window, so a SYN that finds no
socket of its own still meets one. The initiator is the client of the noise handshake (as in
go-libp2p). The new connection is registered with the Host like any other; the relayed one stays
open for the caller to retire. Where a NAT maps every connection to a fresh port (symmetric NAT)
its side's SYNs leave from an unpredicted port: they still land on the other side's listener if
that side's NAT filters by address at most (full cone, restricted cone; ADR 0194); otherwise
every SYN misses and ``direct_connect`` returns None: the peers stay relayed, unless the NAT
allocates ports sequentially: CONNECT then offers the ports its next flows will take as well
(``offer_addrs``, ``relay/port_prediction.py``; ADR 0204).

The Host cannot dial from a given local port yet (ADR 0070), so this module opens those sockets
itself and hands them to ``Host.upgrade``. Where both sides listen on QUIC, CONNECT also offers the
QUIC listener's mapping (``connect_public`` to a relay's ``/quic-v1`` address) and the QUIC punch
(``relay/quic_punch.py``) runs beside the TCP one: the first direct connection wins (ADR 0228).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable
from typing import cast

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection, DialError, Host
from node.p2p.multiaddr import Multiaddr
from node.p2p.secure_conn import TcpConnection

from .birthday import birthday_dials
from .dcutr import DCUTR_PROTOCOL, MAX_OBS_ADDRS, DcutrError, DcutrInitiator, DcutrResponder, Dial, Send
from .ipv6_addrs import global_ipv6
from .port_prediction import PREDICT_PORTS, fresh_mapping, predicted_addrs, rewrites_ports
from .punch_io import bound_socket, connect_until, no_path, observed_addr, readable, speaks
from .quic_punch import QuicPunch, first_success

log = logging.getLogger(__name__)

EXCHANGE_TIMEOUT = 10.0   # the whole CONNECT/CONNECT/SYNC exchange
PUNCH_WINDOW = 5.0        # how long both sides keep dialing after the agreed moment
REFUSED_RETRY_S = 0.02    # pause after an immediate refusal (RST) before dialing again
ATTEMPTS = 3              # exchanges per direct_connect (the spec's retry count)
_PUNCH_ERRORS = (DcutrError, ProtocolError, ConnectionError, TimeoutError, OSError, DialError,
                 asyncio.IncompleteReadError)


def _family(addr: Multiaddr) -> int:
    return socket.AF_INET6 if addr.parts[0][0] == "ip6" else socket.AF_INET


class HolePuncher:
    def __init__(self, host: Host, punch_port: int = 0, *, attempts: int = ATTEMPTS,
                 punch_window: float = PUNCH_WINDOW, predict: int = PREDICT_PORTS, ipv6: bool = True,
                 tcp: bool = True) -> None:
        self.host = host
        self.tcp = tcp                              # punch TCP (False: QUIC only)
        self.quic = QuicPunch(host)                 # the QUIC half, run beside TCP (ADR 0228)
        self.ipv6 = ipv6                            # offer our global IPv6 addresses too
        self.port = punch_port
        self.attempts = attempts
        self.punch_window = punch_window
        self.observed: dict[str, Multiaddr] = {}   # public peer -> how it sees our punch port
        self.mapped: list[Multiaddr] = []          # where our router forwards to the punch port (ADR 0221)
        self.direct: dict[str, Connection] = {}    # peers we punched through to, latest connection
        self._public: dict[str, Connection] = {}   # connections made from the punch port
        self._public_addr: dict[str, Multiaddr] = {}  # and the addresses they were made to
        self.predict = predict                      # ports predicted for a port-rewriting NAT (0: off)
        self._punched = asyncio.Event()
        self._listening = asyncio.Lock()
        self._exchanging: dict[str, int] = {}       # peer -> dcutr exchanges/punches in progress
        self._upgrades: set[asyncio.Future] = set()  # TCP upgrades left to finish after QUIC won
        self._answering: set[asyncio.Task] = set()    # DCUtR answers (``serve``), each in a task

    def start(self) -> None:
        """Register the responder; with port 0, pick the punch port now."""
        if self.port == 0:
            probe = bound_socket(socket.AF_INET, 0)
            self.port = probe.getsockname()[1]
            probe.close()
        self.host.set_handler(DCUTR_PROTOCOL, self.serve)

    # ---- address discovery
    async def connect_public(self, addr: str | Multiaddr) -> Multiaddr | None:
        """Connect to the public peer at ``addr`` (``.../p2p/<id>``) from the punch port and return the
        address it observed us at (None if it sent none). Raises DialError/ProtocolError/OSError."""
        addr = Multiaddr.parse(addr)
        peer = addr.peer_id
        if peer is None:
            raise ValueError(f"multiaddr needs a /p2p/<peer id> suffix: {addr}")
        if addr.is_quic:   # the QUIC listener's mapping (ADR 0228)
            return await self.quic.connect_public(addr)
        live = self._public.get(peer)
        if live is not None and not live.closed:  # one connection per peer from the punch port
            return self.observed.get(peer)
        ip, port = addr.tcp_endpoint()
        sock = bound_socket(_family(addr), self.port)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.host.limits.handshake_timeout):
                await loop.sock_connect(sock, (ip, port))
            _transport, tcp = await loop.create_connection(TcpConnection, sock=sock)
        except BaseException:
            sock.close()
            raise
        self.host.peerbook.add_addrs(peer, [addr])
        conn = await self.host.upgrade(tcp, is_initiator=True, expected_peer=peer)
        self._public[peer] = conn
        self._public_addr[peer] = addr
        observed = await self._observed_addr(conn)
        if observed is not None:
            self.observed[peer] = observed
        return observed

    async def _observed_addr(self, conn: Connection) -> Multiaddr | None:
        async with asyncio.timeout(self.host.limits.identify_timeout):
            return await observed_addr(conn)

    def connected_public(self, peer: str) -> bool:
        """Whether a connection from the punch port to the public peer ``peer`` is open."""
        live = self._public.get(peer)
        return live is not None and not live.closed

    def busy(self, peer: str) -> bool:
        """Whether a hole punch with ``peer`` (either side's) is in progress."""
        return self._exchanging.get(peer, 0) > 0

    @contextlib.contextmanager
    def _exchange_with(self, peer: str):
        self._exchanging[peer] = self._exchanging.get(peer, 0) + 1
        try:
            yield
        finally:
            self._exchanging[peer] -= 1
            if not self._exchanging[peer]:
                del self._exchanging[peer]

    def own_addrs(self) -> list[Multiaddr]:
        """Our punch port as public peers see it over live connections (what CONNECT offers): a
        mapping whose connection is gone may have expired in the NAT; and, with ``ipv6``, the punch
        port on this host's global IPv6 addresses, which no NAT rewrites (relay/ipv6_addrs.py). A
        port mapping our router granted for the punch port (``mapped``) comes first: anyone can
        dial it (ADR 0221). Then the QUIC listener's mappings and, with ``ipv6``, its global IPv6
        addresses (ADR 0228)."""
        out = list(self.mapped)
        for peer, addr in self.observed.items():
            conn = self._public.get(peer)
            if conn is not None and not conn.closed and addr not in out:
                out.append(addr)
        out += [addr for addr in self.quic.own_addrs() if addr not in out]
        if self.ipv6 and self.port:
            out += [Multiaddr.parse(f"/ip6/{ip}/tcp/{self.port}") for ip in global_ipv6()]
        if self.ipv6:
            out += [addr for addr in self.quic.ipv6_addrs() if addr not in out]
        return out

    async def offer(self) -> tuple[list[Multiaddr], bool]:
        """What CONNECT offers, and whether our NAT maps each flow to a random port. ``own_addrs``;
        where the NAT rewrote the punch port, two fresh mapping probes tell a sequential NAT (the
        second port follows the first: its next ports are offered too, ``relay/port_prediction.py``)
        from a random one (birthday probing instead, ``relay/birthday.py``)."""
        out = self.own_addrs()
        if not self.predict:
            return out, False
        for peer, observed in list(self.observed.items()):
            relay = self._public_addr.get(peer)
            if relay is None or observed not in out or not rewrites_ports(observed, self.port):
                continue
            first = await fresh_mapping(self.host, relay)
            second = await fresh_mapping(self.host, relay) if first is not None else None
            if first is None or second is None:
                return out, False
            if second.tcp_endpoint()[1] != first.tcp_endpoint()[1] + 1:
                return out, True
            out += [a for a in predicted_addrs(second, self.predict) if a not in out]
            return out[:MAX_OBS_ADDRS], False  # one relay probed per exchange
        return out, False

    # ---- initiator
    async def direct_connect(self, relayed: Connection) -> Connection | None:
        """Try to replace ``relayed`` by a direct connection to the same peer; None if every attempt
        failed (the caller stays on the relayed connection)."""
        with self._exchange_with(relayed.remote_peer):
            return await self._direct_connect(relayed)

    async def _direct_connect(self, relayed: Connection) -> Connection | None:
        for attempt in range(1, self.attempts + 1):
            try:
                conn = await self._initiate(relayed)
            except _PUNCH_ERRORS as exc:
                log.info("hole punch to %s, attempt %d: %s", relayed.remote_peer, attempt, exc)
                if relayed.closed:
                    return None
                continue
            self._record(conn)
            return conn
        return None

    async def _initiate(self, relayed: Connection) -> Connection:
        offer, own_random = await self.offer()
        core = DcutrInitiator(offer, own_random)
        if not core.own_addrs:
            raise DcutrError("no observed address yet: call connect_public first")
        stream = await relayed.open_stream(DCUTR_PROTOCOL)
        try:
            async with asyncio.timeout(EXCHANGE_TIMEOUT):
                await stream.write(core.start(time.monotonic()).data)
                dial = None
                while dial is None:
                    data = await stream.read()
                    if not data:
                        raise DcutrError("stream ended during the exchange")
                    for event in core.receive(data, time.monotonic()):
                        if isinstance(event, Send):
                            await stream.write(event.data)
                        elif isinstance(event, Dial):
                            dial = event
            await stream.close()
        except BaseException:
            stream.reset()
            raise
        await asyncio.sleep(max(0.0, dial.at - time.monotonic()))
        return await self._punch_direct(dial, relayed.remote_peer, initiator=True, own_random=own_random)

    async def peer_punch(self, peer: str, first: float, timeout: float) -> Connection | None:
        """The direct connection a punch *started by ``peer``* gives (the DCUtR spec's roles: the
        inbound side of the relayed connection sends CONNECT): None if the peer started none
        within ``first`` seconds, or its punch did not end on a connection within ``timeout``."""
        deadline = time.monotonic() + timeout
        started = time.monotonic() + first
        while not self.busy(peer):
            conn = self._direct_now(peer)
            if conn is not None:
                return conn
            if time.monotonic() >= started:
                return None
            await asyncio.sleep(0.02)
        while self.busy(peer) and self._direct_now(peer) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self._direct_now(peer)

    def _direct_now(self, peer: str) -> Connection | None:
        """A live direct connection to ``peer``: punched, or dialed by the peer (reversal)."""
        conn = self.direct.get(peer)
        if conn is not None and not conn.closed:
            return conn
        return next((c for c in self.host.connections(peer)
                     if not c.bulk and not c.closed and not c.relayed), None)

    def reversing(self, peer: str):
        """Mark a connection reversal to ``peer`` as a hole punch in progress (``busy``)."""
        return self._exchange_with(peer)

    # ---- responder
    async def serve(self, stream) -> None:
        """The ``/libp2p/dcutr`` handler: answer CONNECT, punch on SYNC. The answer runs in a task of
        the puncher's own: the relayed connection it came on is retired as soon as either side has
        the direct connection, which cancels the handler, and must not cancel the punch before it
        has recorded that connection."""
        answer = asyncio.ensure_future(self._serve(stream))
        self._answering.add(answer)
        answer.add_done_callback(self._answering.discard)
        with self._exchange_with(stream.remote_peer):  # busy from the first byte, not the task's start
            await asyncio.shield(answer)

    async def _serve(self, stream) -> None:
        with self._exchange_with(stream.remote_peer):
            await self._respond(stream)

    async def close(self) -> None:
        """Stop the answers and TCP upgrades still running (the node is stopping)."""
        running = [*self._answering, *self._upgrades]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _respond(self, stream) -> None:
        offer, own_random = await self.offer()
        core = DcutrResponder(offer, own_random)
        dial = None
        try:
            async with asyncio.timeout(EXCHANGE_TIMEOUT):
                while dial is None:
                    data = await stream.read()
                    if not data:
                        raise DcutrError("stream ended during the exchange")
                    for event in core.receive(data, time.monotonic()):
                        if isinstance(event, Send):
                            await stream.write(event.data)
                        elif isinstance(event, Dial):
                            dial = event
        except (DcutrError, TimeoutError) as exc:
            log.debug("dcutr exchange with %s failed: %s", stream.remote_peer, exc)
            stream.reset()
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            await stream.close()
        try:
            conn = await self._punch_direct(dial, stream.remote_peer, initiator=False, own_random=own_random)
        except _PUNCH_ERRORS as exc:
            log.info("hole punch from %s failed: %s", stream.remote_peer, exc)
            return
        if conn.remote_peer != stream.remote_peer:
            log.info("hole punch for %s reached %s; closing", stream.remote_peer, conn.remote_peer)
            await conn.close()
            return
        self._record(conn)

    def _record(self, conn: Connection) -> None:
        self.direct[conn.remote_peer] = conn
        self._punched.set()

    async def wait_direct(self, peer: str, timeout: float) -> Connection | None:
        """The direct connection punched to ``peer`` (by either side), waiting up to ``timeout``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while (conn := self.direct.get(peer)) is None or conn.closed:
                    self._punched.clear()
                    await self._punched.wait()
                return conn
        return None

    # ---- the punch itself
    async def _punch_direct(self, dial: Dial, peer: str, *, initiator: bool, own_random: bool) -> Connection:
        """The TCP and the QUIC punch at once (ADR 0228); the first connection wins and the other
        punch stops. For QUIC the DCUtR initiator is the server, the responder the client (the spec)."""
        tcp_addrs = tuple(a for a in dial.addrs if not a.is_quic)
        quic_addrs = tuple(a for a in dial.addrs if a.is_quic)
        deadline = time.monotonic() + self.punch_window
        attempts = []
        if tcp_addrs and self.tcp:
            attempts.append(self._tcp_direct(tcp_addrs, peer, initiator, (own_random, dial.remote_random)))
        if quic_addrs:
            attempts.append(self.quic.accept(quic_addrs, peer, deadline) if initiator
                            else self.quic.dial(quic_addrs, peer, deadline))
        return await first_success(attempts, "hole punch")

    async def _tcp_direct(self, addrs, peer: str, initiator: bool, birthday: tuple[bool, bool]) -> Connection:
        """The TCP punch and its upgrade. Once a socket connected, the upgrade finishes even if the QUIC
        punch wins meanwhile: the peer may already have taken this connection, and aborting it here
        would close the one it chose."""
        tcp = await self._punch(addrs, birthday=birthday, speaker=initiator)   # the noise initiator speaks first
        upgrade = asyncio.ensure_future(
            self.host.upgrade(tcp, is_initiator=initiator, expected_peer=peer if initiator else None))
        self._upgrades.add(upgrade)
        upgrade.add_done_callback(functools.partial(self._upgrade_done, peer))
        return await asyncio.shield(upgrade)

    def _upgrade_done(self, peer: str, upgrade: asyncio.Future) -> None:
        self._upgrades.discard(upgrade)
        if upgrade.cancelled():
            return
        if upgrade.exception() is not None:
            log.debug("hole punch upgrade failed: %s", upgrade.exception())
        elif upgrade.result().remote_peer != peer:   # a punch that reached someone else
            closing = asyncio.ensure_future(upgrade.result().close())
            self._upgrades.add(closing)
            closing.add_done_callback(self._upgrades.discard)

    async def _punch(self, addrs, birthday: tuple[bool, bool] = (False, False), *,
                     speaker: bool = True) -> TcpConnection:
        """Dial every address from the punch port until one connects, and accept on it too, within
        the punch window (plus birthday probing where one side's NAT is random: ``birthday`` is
        (ours, the peer's)); the rest are closed. Several sockets may connect (a sprayed side's,
        a full cone's listener taking them all), and both sides must take the same one: the
        ``speaker`` (the noise initiator, who writes first) takes the first connected socket, the
        other side the first on which bytes arrive (``_first_spoken_to``)."""
        async with self._listening:  # one listener at a time, so a SYN cannot land on another punch's
            return await self._punch_once(addrs, birthday, speaker)

    async def _punch_once(self, addrs, birthday: tuple[bool, bool], speaker: bool = True) -> TcpConnection:
        deadline = time.monotonic() + self.punch_window
        tasks = [asyncio.ensure_future(self._dial_until(addr, deadline)) for addr in addrs]
        # with a port mapping offered, the peer's SYNs reach our listener through the router: probing
        # its random ports too would only make competing connections (each side keeping another one)
        tasks += [asyncio.ensure_future(dial) for dial in birthday_dials(
            tuple(addrs), self.port, own_random=birthday[0], peer_random=birthday[1] and not self.mapped,
            deadline=deadline)]
        listeners: list[socket.socket] = []
        accepting: dict[asyncio.Task, Callable[[], asyncio.Task]] = {}
        try:
            expected = {addr.tcp_endpoint()[0] for addr in addrs}
            families = {socket.AF_INET} | {_family(addr) for addr in addrs}
            for family in sorted(families):
                listener = bound_socket(family, self.port)
                listeners.append(listener)
                listener.listen(8)

                def accept(listener: socket.socket = listener) -> asyncio.Task:
                    return asyncio.ensure_future(self._accept_from(listener, expected, deadline))
                task = accept()
                accepting[task] = accept
                tasks.append(task)
            if speaker:
                sock = await self._first_socket(tasks, deadline)
            else:
                sock = await self._first_spoken_to(tasks, accepting, deadline)
        finally:
            for task in tasks:
                task.cancel()
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, socket.socket):
                    result.close()
            for listener in listeners:
                listener.close()
        loop = asyncio.get_running_loop()
        try:
            _transport, tcp = await loop.create_connection(TcpConnection, sock=sock)
        except BaseException:
            sock.close()
            raise
        return tcp

    @staticmethod
    async def _first_socket(tasks: list[asyncio.Task[socket.socket]], deadline: float) -> socket.socket:
        pending = set(tasks)
        errors = []
        while pending:
            done, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()) + 1.0,
                                               return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break
            for task in done:
                if task.exception() is None:
                    tasks.remove(task)
                    return task.result()
                errors.append(repr(task.exception()))
        raise no_path("hole punch", errors, "timed out")

    @staticmethod
    async def _first_spoken_to(tasks: list[asyncio.Task[socket.socket]],
                               accepting: dict[asyncio.Task, Callable[[], asyncio.Task]],
                               deadline: float) -> socket.socket:
        """The first socket, of those ``tasks`` connect (a listener's accept task is started again
        after each connection, ``accepting``), on which the peer's first bytes arrive; sockets that
        end first are closed. Raises ConnectionError when none is spoken to by the punch window's
        end (plus a second for the handshake's first message)."""
        pending: set[asyncio.Future] = set(tasks)
        connected: dict[asyncio.Future, socket.socket] = {}
        errors = []
        try:
            while pending or connected:
                left = max(0.0, deadline - time.monotonic()) + 1.0
                done, _ = await asyncio.wait(pending | set(connected), timeout=left,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
                for fut in done:
                    if fut in connected:
                        sock = connected.pop(fut)
                        spoken = speaks(sock)
                        if spoken:
                            return sock
                        if spoken is None:   # woken with nothing to read: wait again
                            connected[readable(sock)] = sock
                        else:
                            sock.close()
                        continue
                    task = cast("asyncio.Task[socket.socket]", fut)   # not a readability future: a task
                    pending.discard(task)
                    if task.exception() is not None:
                        errors.append(repr(task.exception()))
                        continue
                    tasks.remove(task)   # its socket is ours to close now
                    sock = task.result()
                    connected[readable(sock)] = sock
                    again = accepting.get(task)
                    if again is not None:
                        more = again()
                        accepting[more] = again
                        tasks.append(more)
                        pending.add(more)
        finally:
            loop = asyncio.get_running_loop()
            for fut, sock in connected.items():
                loop.remove_reader(sock.fileno())
                fut.cancel()
                sock.close()
        raise ConnectionError("hole punch: no connected socket was spoken to: " + ("; ".join(errors) or "timed out"))

    async def _dial_until(self, addr: Multiaddr, deadline: float) -> socket.socket:
        ip, port = addr.tcp_endpoint()
        return await connect_until(ip, port, self.port, deadline, REFUSED_RETRY_S)

    @staticmethod
    async def _accept_from(listener: socket.socket, expected_ips: set[str], deadline: float) -> socket.socket:
        """The first connection accepted from one of ``expected_ips`` (others are closed) before
        ``deadline``."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            while True:
                sock, peer = await loop.sock_accept(listener)
                if peer[0] in expected_ips:
                    return sock
                sock.close()

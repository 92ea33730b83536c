"""The endpoint side of circuit relay v2: reservations, relayed addresses, dialing through relays,
accepting inbound circuits, and co-signing usage receipts.

``RelayClient.maintain(candidates)`` keeps ``want`` reservations on the least loaded relays (their
load reports, relay/load.py; the lowest measured round-trip time among those equally loaded,
relay/choice.py), refreshes each before it expires, replaces a relay at once when its connection
dies, and every ``LOAD_POLL_S`` asks the candidates for their load again and moves a reservation
when another relay is much less loaded (ADR 0227; the relay left keeps serving inbound circuits
until that reservation expires); ``relayed_addrs`` lists ``<relay addr>/p2p-circuit/p2p/<us>`` for
the node's ledger record. ``dial(target, circuit_addrs)`` connects through the first relay that
works, trying the least loaded first (``rank_circuit_addrs``, also the Host's relay ranking) and
relays that failed recently last. Inbound circuits are accepted only from relays where we hold a current,
verified voucher, and the peer authenticated by the end-to-end noise handshake must be the one the
relay announced. Callbacks registered with ``on_inbound`` get each inbound relayed Connection as it
comes up (the hole puncher's "B" role starts from there).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from node.p2p.errors import ProtocolError
from node.p2p.host import Connection, DialError, Host
from node.p2p.limited import LimitedConnectionError, describe_limit, is_limited
from node.p2p.multiaddr import Multiaddr

from . import choice
from .load import LoadReport, query_load
from .messages import (
    HOP_PROTOCOL,
    STOP_PROTOCOL,
    HopMessage,
    HopType,
    Peer,
    RelayMessageError,
    Status,
    StopMessage,
    StopType,
    decode_hop,
    decode_stop,
    encode_hop,
    encode_stop,
    frame,
)
from .receipts import RECEIPT_PROTOCOL, CircuitCount, ReceiptSigner
from .service import read_message
from .transport import StreamPipe, upgrade_circuit
from .voucher import VoucherError, open_voucher

log = logging.getLogger(__name__)

REFRESH_FRACTION = 0.5       # refresh when half the reservation's lifetime is left... at most
REFRESH_MARGIN_S = 60.0      # ...or this long before it expires, whichever comes first
HEALTH_CHECK_S = 0.5         # how often maintain() checks that reserved relays are still connected
FAILED_RELAY_PENALTY_S = 30.0
KEEP_CLOSED_SESSIONS = 1024  # closed circuits remembered for their final receipts
DIAL_STAGGER_S = 2.0
RTT_WINDOW_S = 1.0           # candidates slower than this to answer a ping are not waited for
MEASURE_TIMEOUT_S = 5.0
RESERVE_TIMEOUT_S = 10.0         # start the next relay's attempt when one has not succeeded by then
LOAD_POLL_S = 30.0               # how often maintain() asks the candidate relays for their load
LOAD_QUERY_TIMEOUT_S = 5.0


class RelayRefused(ConnectionError):
    """A relay answered a hop request with a status other than OK."""

    def __init__(self, relay: str, status: Status | None) -> None:
        super().__init__(f"relay {relay} refused: {status.name if status is not None else 'no status'}")
        self.status = status


@dataclass
class ActiveReservation:
    relay: str
    relay_addr: Multiaddr     # the address we reach the relay on (with /p2p/<relay>)
    expire: int
    granted_at: float
    addrs: tuple[Multiaddr, ...]
    voucher: bytes | None
    rtt: float = 0.0
    held_since: float = 0.0   # when this relay first granted the reservation (refreshes keep it)


def _close_if_connected(task: asyncio.Task) -> None:
    """Done-callback of a losing dial attempt: close the circuit if it came up after all."""
    if not task.cancelled() and task.exception() is None:
        asyncio.ensure_future(task.result().close())


def relay_part(addr: Multiaddr) -> Multiaddr:
    """``<relay addr>/p2p/R/p2p-circuit[/p2p/T]`` -> ``<relay addr>/p2p/R`` (the address itself if not relayed)."""
    names = [n for n, _ in addr.parts]
    return Multiaddr(addr.parts[:names.index("p2p-circuit")]) if "p2p-circuit" in names else addr


def split_circuit_addr(addr: str | Multiaddr) -> tuple[Multiaddr, str]:
    """``<relay addr>/p2p/R/p2p-circuit/p2p/T`` -> (``<relay addr>/p2p/R``, T)."""
    addr = Multiaddr.parse(addr)
    names = [n for n, _ in addr.parts]
    if "p2p-circuit" not in names:
        raise ValueError(f"not a relayed address: {addr}")
    cut = names.index("p2p-circuit")
    relay_addr = Multiaddr(addr.parts[:cut])
    target = addr.peer_id
    if relay_addr.peer_id is None or target is None or cut != len(names) - 2:
        raise ValueError(f"relayed address must be <relay>/p2p/R/p2p-circuit/p2p/T: {addr}")
    return relay_addr, target


class RelayClient:
    def __init__(self, host: Host, *, chain_id: str = "dekube-local", max_price_per_mib: int = 1,
                 want: int = 2) -> None:
        self.host = host
        self.want = want
        self.reservations: dict[str, ActiveReservation] = {}
        self.circuits: OrderedDict[bytes, tuple[CircuitCount, StreamPipe]] = OrderedDict()
        self._failed: dict[str, float] = {}
        self._signer = ReceiptSigner(host.identity, chain_id, self._lookup_circuit, max_price_per_mib)
        self._changed = asyncio.Event()
        self._inbound_callbacks: list[Callable[[Connection], None]] = []
        self.loads = choice.RelayLoads()
        self._retiring: dict[str, ActiveReservation] = {}  # left for a less loaded relay, kept until expiry
        self._load_queries: dict[str, asyncio.Task] = {}

    def start(self) -> None:
        self.host.set_handler(STOP_PROTOCOL, self._serve_stop)
        self.host.set_handler(RECEIPT_PROTOCOL, self._signer.serve)

    # ---- reservations
    async def reserve(self, relay_addr: str | Multiaddr) -> ActiveReservation:
        """Reserve a slot on the relay at ``relay_addr`` (``.../p2p/<relay>``); raises RelayRefused,
        VoucherError, RelayMessageError, DialError or TimeoutError."""
        relay_addr = Multiaddr.parse(relay_addr)
        relay = await self.host.connect(str(relay_addr))
        stream = await self.host.open_stream(relay, HOP_PROTOCOL)
        try:
            await stream.write(frame(encode_hop(HopMessage(HopType.RESERVE))))
            answer, _ = await read_message(stream, decode_hop)
        finally:
            stream.reset()
        if answer.type != HopType.STATUS or answer.status != Status.OK or answer.reservation is None:
            raise RelayRefused(relay, answer.status)
        rsvp = answer.reservation
        if rsvp.voucher is not None:
            open_voucher(rsvp.voucher, relay, self.host.peer_id, time.time())
        record = ActiveReservation(relay, relay_addr, rsvp.expire, time.time(), rsvp.addrs, rsvp.voucher)
        previous = self.reservations.get(relay)
        record.rtt = previous.rtt if previous else 0.0
        record.held_since = previous.held_since if previous else record.granted_at
        self._retiring.pop(relay, None)
        self.reservations[relay] = record
        self._changed.set()
        return record

    @property
    def relayed_addrs(self) -> list[str]:
        """Our addresses through the relays we hold reservations on (for the ledger record)."""
        out = []
        for rsvp in sorted(self.reservations.values(), key=lambda r: r.rtt):
            if rsvp.expire <= time.time():
                continue
            bases = [a for a in rsvp.addrs if not a.is_relayed] or [rsvp.relay_addr]
            for base in bases:
                out.append(str(base.with_peer_id(rsvp.relay).encapsulate(f"/p2p-circuit/p2p/{self.host.peer_id}")))
        return out

    def _needs_refresh(self, rsvp: ActiveReservation) -> bool:
        lifetime = rsvp.expire - rsvp.granted_at
        left = rsvp.expire - time.time()
        return left <= min(lifetime * REFRESH_FRACTION, REFRESH_MARGIN_S)

    async def _measure(self, relay_addr: Multiaddr) -> float:
        relay = await self.host.connect(str(relay_addr))
        return await self.host.ping(relay)

    async def maintain(self, candidates: list[str]) -> None:
        """Keep ``want`` live reservations among ``candidates`` (relay multiaddrs); runs until cancelled."""
        addrs = [Multiaddr.parse(c) for c in candidates]
        next_poll = time.monotonic() + LOAD_POLL_S
        while True:
            for relay, rsvp in list(self._retiring.items()):
                if rsvp.expire <= time.time():
                    del self._retiring[relay]
            for relay, rsvp in list(self.reservations.items()):
                if not self.host.is_connected(relay) or rsvp.expire <= time.time():
                    log.info("relay %s lost; reserving elsewhere", relay)
                    self._mark_failed(relay)
                    del self.reservations[relay]
                elif self._needs_refresh(rsvp):
                    try:
                        await self.reserve(rsvp.relay_addr)
                    except (ConnectionError, ProtocolError, TimeoutError, OSError) as exc:
                        log.info("refreshing the reservation on %s failed: %s", relay, exc)
                        self._mark_failed(relay)
                        self.reservations.pop(relay, None)
            if len(self.reservations) < self.want:
                await self._add_reservations(addrs)
            elif time.monotonic() >= next_poll:
                next_poll = time.monotonic() + LOAD_POLL_S
                await self._rebalance(addrs)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEALTH_CHECK_S):
                    await self._changed.wait()

    async def _add_reservations(self, addrs: list[Multiaddr]) -> None:
        """Measure the RTT of the spare candidates (those answering within RTT_WINDOW_S, or the
        first to answer at all) and reserve on the fastest until ``want`` are held."""
        spare = [a for a in addrs if a.peer_id not in self.reservations and a.peer_id != self.host.peer_id]
        if not spare:
            return
        tasks = {asyncio.ensure_future(self._timed(self._measure(a), MEASURE_TIMEOUT_S)): a for a in spare}
        done, pending = await asyncio.wait(tasks, timeout=RTT_WINDOW_S)
        while pending and not any(not t.exception() for t in done):
            more, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done |= more
        for task in pending:
            task.cancel()
        measured = [(task.result(), tasks[task]) for task in done if not task.exception()]
        await self.refresh_loads([addr for _, addr in measured], wait=RTT_WINDOW_S)
        now = time.monotonic()
        loads = [self.loads.effective(a.peer_id or "", now) for _, a in measured]
        ranked = choice.rank_for_reservation(measured, loads)
        ranked.sort(key=lambda item: self._recently_failed(item[1].peer_id))
        for rtt, addr in ranked:
            if len(self.reservations) >= self.want:
                return
            try:
                rsvp = await self._timed(self.reserve(addr), RESERVE_TIMEOUT_S)
            except (ConnectionError, ProtocolError, TimeoutError, OSError) as exc:
                log.info("reservation on %s failed: %s", addr, exc)
                self._mark_failed(addr.peer_id)
                continue
            rsvp.rtt = rtt

    async def _rebalance(self, addrs: list[Multiaddr]) -> None:
        """Ask the candidates for their load and move one reservation if another relay is much less
        loaded (``choice.move``); the relay left serves inbound circuits until the reservation expires."""
        candidates = {a.peer_id: a for a in addrs if a.peer_id is not None and a.peer_id != self.host.peer_id}
        await self.refresh_loads(list(candidates.values()))
        now, clock = time.monotonic(), time.time()
        held = {relay: (self.loads.effective(relay, now), rsvp.held_since)
                for relay, rsvp in self.reservations.items()}
        spare = {relay: self.loads.effective(relay, now) for relay in candidates
                 if relay not in self.reservations and self.loads.fresh(relay, now)
                 and not self._recently_failed(relay)}
        picked = choice.move(held, spare, clock)
        if picked is None:
            return
        leave, join = picked
        try:
            rtt = await self._timed(self._measure(candidates[join]), MEASURE_TIMEOUT_S)
            rsvp = await self._timed(self.reserve(candidates[join]), RESERVE_TIMEOUT_S)
        except (ConnectionError, ProtocolError, TimeoutError, OSError) as exc:
            log.info("moving the reservation on %s to the less loaded %s failed: %s", leave, join, exc)
            self._mark_failed(join)
            return
        rsvp.rtt = rtt
        log.info("reservation moved from %s to the less loaded %s", leave, join)
        retired = self.reservations.pop(leave, None)
        if retired is not None:
            self._retiring[leave] = retired
        self._changed.set()

    # ---- relay load
    async def refresh_loads(self, relay_addrs: list[str] | list[Multiaddr], wait: float | None = None) -> None:
        """Ask each relay at ``relay_addrs`` (``.../p2p/<relay>``) for its load (at most one query
        per relay at a time) and wait for the answers, or ``wait`` seconds (the rest come in later);
        a relay that does not answer in time has an unknown load."""
        parsed = [Multiaddr.parse(a) for a in relay_addrs]
        tasks = {self._load_query(a) for a in parsed if a.peer_id is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=wait)

    def _load_query(self, relay_addr: Multiaddr) -> asyncio.Task:
        relay = relay_addr.peer_id
        assert relay is not None
        task = self._load_queries.get(relay)
        if task is None:
            task = asyncio.ensure_future(self._ask_load(relay, relay_addr))
            self._load_queries[relay] = task
            task.add_done_callback(lambda _: self._load_queries.pop(relay, None))
        return task

    async def _ask_load(self, relay: str, relay_addr: Multiaddr) -> None:
        try:
            async with asyncio.timeout(LOAD_QUERY_TIMEOUT_S):
                await self.host.connect(str(relay_addr))
                report: LoadReport = await query_load(self.host, relay)
        except (ConnectionError, ProtocolError, TimeoutError, OSError) as exc:
            log.debug("relay %s gave no load report: %s", relay, exc)
            self.loads.forget(relay)
            return
        self.loads.record(relay, report, time.monotonic(), self.open_circuits().get(relay, 0))

    def open_circuits(self) -> dict[str, int]:
        """Our open circuits per relay."""
        out: dict[str, int] = {}
        for count, pipe in self.circuits.values():
            if not pipe.is_closed:
                out[count.relay] = out.get(count.relay, 0) + 1
        return out

    def rank_circuit_addrs(self, addrs: list[Multiaddr]) -> list[Multiaddr]:
        """Relayed addresses (``<relay>/p2p/R/p2p-circuit[/p2p/T]``) in the order a dial should try them
        (``choice.rank_relays``: least loaded first, recently failed last). Uses the load reports at
        hand and asks the relays whose report is stale again in the background."""
        relay_addrs = [relay_part(a) for a in addrs]
        relays = [a.peer_id or "" for a in relay_addrs]
        now = time.monotonic()
        if len(set(relays)) > 1:
            stale = set(self.loads.stale(relays, now))
            for relay_addr in {a.peer_id: a for a in relay_addrs if a.peer_id in stale}.values():
                self._load_query(relay_addr)
        own = self.open_circuits()
        loads = [self.loads.effective(r, now, own.get(r, 0)) for r in relays]
        return [addrs[i] for i in choice.rank_relays(relays, loads, own, self._recently_failed)]

    @staticmethod
    async def _timed(coro, seconds: float):
        async with asyncio.timeout(seconds):
            return await coro

    async def abandon(self, conn: Connection) -> None:
        """Give up on the relayed ``conn`` whose path went silent (a resumable transfer's stall):
        close it and try its relay last in dials for a while, so the retry goes another way at once
        rather than after the dial stagger."""
        pipe = self.pipe_for(conn)
        if pipe is not None:
            self._mark_failed(pipe.relay_peer)
        with contextlib.suppress(ConnectionError, ProtocolError, OSError):
            await conn.close()

    def _mark_failed(self, relay: str | None) -> None:
        if relay is not None:   # a relay address without /p2p/ cannot be told apart from others
            self._failed[relay] = time.monotonic()

    def _recently_failed(self, relay: str | None) -> bool:
        failed_at = None if relay is None else self._failed.get(relay)
        return failed_at is not None and time.monotonic() - failed_at < FAILED_RELAY_PENALTY_S

    # ---- dialing through relays
    async def dial(self, circuit_addrs: list[str], *, bulk: bool = False,
                   stagger: float = DIAL_STAGGER_S) -> Connection:
        """Connect through the first relay among ``circuit_addrs`` (all for one target) that works.

        Relays that failed recently are tried last; when an attempt has not finished within
        ``stagger`` seconds the next relay is tried alongside it (a dead relay whose packets
        vanish costs ``stagger``, not a TCP timeout). The first circuit up wins; the others are
        cancelled or closed. Raises DialError if none works.
        """
        ranked = self.rank_circuit_addrs([Multiaddr.parse(a) for a in circuit_addrs])
        waiting = [split_circuit_addr(a) for a in ranked]
        attempts: dict[asyncio.Task, Multiaddr] = {}
        errors = []
        try:
            while waiting or attempts:
                if waiting:
                    relay_addr, target = waiting.pop(0)
                    task = asyncio.ensure_future(self.dial_via(relay_addr, target, bulk=bulk))
                    attempts[task] = relay_addr
                done, _ = await asyncio.wait(attempts, timeout=stagger if waiting else None,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    relay_addr = attempts.pop(task)
                    exc = task.exception()
                    if exc is None:
                        return task.result()
                    if not isinstance(exc, (ConnectionError, ProtocolError, TimeoutError, OSError)):
                        raise exc
                    if not isinstance(exc, LimitedConnectionError):  # it still carries signalling
                        self._mark_failed(relay_addr.peer_id)
                    errors.append(f"{relay_addr}: {type(exc).__name__}: {exc}")
        finally:
            for task in attempts:
                task.cancel()
                task.add_done_callback(_close_if_connected)
        raise DialError("no relay reached the target: " + ("; ".join(errors) or "no relayed address"))

    async def dial_via(self, relay_addr: str | Multiaddr, target: str, *, bulk: bool = False) -> Connection:
        """Open a circuit to ``target`` through the relay at ``relay_addr`` and upgrade it."""
        relay_addr = Multiaddr.parse(relay_addr)
        relay = await self.host.connect(str(relay_addr))
        relay_conn = await self.host.open_bulk_connection(relay) if bulk else None
        try:
            if relay_conn is not None:
                stream = await relay_conn.open_stream(HOP_PROTOCOL)
            else:
                stream = await self.host.open_stream(relay, HOP_PROTOCOL)
        except BaseException:
            if relay_conn is not None:
                await relay_conn.close()
            raise
        try:
            await stream.write(frame(encode_hop(HopMessage(HopType.CONNECT, peer=Peer(target)))))
            answer, rest = await read_message(stream, decode_hop)
            if answer.type != HopType.STATUS or answer.status != Status.OK:
                raise RelayRefused(relay, answer.status)
            if bulk and is_limited(answer.limit):  # a capped circuit would die mid-transfer
                raise LimitedConnectionError(
                    f"relay {relay} limits circuits ({describe_limit(answer.limit)}): no bulk over it",
                    answer.limit)
            pipe = StreamPipe(stream, relay, answer.session, rest)
            conn = await upgrade_circuit(self.host, pipe, True, target, bulk=bulk, limit=answer.limit)
        except BaseException:
            stream.reset()
            if relay_conn is not None:
                await relay_conn.close()
            raise
        if relay_conn is not None:  # the dedicated relay connection lives as long as the circuit on it
            if pipe.is_closed:
                await relay_conn.close()
            else:
                pipe.connection_lost_callbacks.append(lambda: asyncio.ensure_future(relay_conn.close()))
        self._remember(pipe, relay, target, is_source=True)
        return conn

    # ---- inbound circuits
    def on_inbound(self, callback: Callable[[Connection], None] | None) -> None:
        """Call ``callback(conn)`` for each inbound relayed connection once it is up (None: stop);
        one callback at a time, and it must not block (start a task for any work)."""
        self._inbound_callbacks = [] if callback is None else [callback]

    async def _serve_stop(self, stream) -> None:
        relay = stream.remote_peer
        try:
            msg, rest = await read_message(stream, decode_stop)
        except RelayMessageError as exc:
            log.debug("malformed stop message from %s: %s", relay, exc)
            await self._stop_reply(stream, Status.MALFORMED_MESSAGE)
            return
        except TimeoutError:
            stream.reset()
            return
        if msg.type != StopType.CONNECT or msg.peer is None:
            await self._stop_reply(stream, Status.UNEXPECTED_MESSAGE)
            return
        if not self._holds_reservation(relay):
            await self._stop_reply(stream, Status.PERMISSION_DENIED)
            return
        await stream.write(frame(encode_stop(StopMessage(StopType.STATUS, status=Status.OK))))
        pipe = StreamPipe(stream, relay, msg.session, rest)
        try:
            conn = await upgrade_circuit(self.host, pipe, False, None, limit=msg.limit)
        except (ProtocolError, OSError, TimeoutError, DialError) as exc:
            log.debug("inbound circuit via %s failed to upgrade: %s", relay, exc)
            pipe.abort()
            return
        if conn.remote_peer != msg.peer.peer_id:
            log.info("relay %s announced %s but %s answered; closing", relay, msg.peer.peer_id, conn.remote_peer)
            await conn.close()
            return
        self._remember(pipe, relay, conn.remote_peer, is_source=False)
        for callback in self._inbound_callbacks:
            try:
                callback(conn)
            except Exception:  # a faulty callback must not take the circuit down
                log.exception("inbound circuit callback failed")

    async def _stop_reply(self, stream, status: Status) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await stream.write(frame(encode_stop(StopMessage(StopType.STATUS, status=status))))
            await stream.close()

    def _holds_reservation(self, relay: str) -> bool:
        rsvp = self.reservations.get(relay) or self._retiring.get(relay)
        if rsvp is None or rsvp.expire <= time.time():
            return False
        if rsvp.voucher is None:
            return True  # relays that issue no voucher (allowed by the spec): the reservation suffices
        try:
            open_voucher(rsvp.voucher, relay, self.host.peer_id, time.time())
        except VoucherError:
            return False
        return True

    # ---- accounting
    def _remember(self, pipe: StreamPipe, relay: str, remote: str, is_source: bool) -> None:
        if pipe.session is None:
            return
        count = CircuitCount(relay, remote, is_source, lambda: pipe.bytes_total)
        self.circuits[pipe.session] = (count, pipe)
        while len(self.circuits) > KEEP_CLOSED_SESSIONS:
            oldest = next(iter(self.circuits))
            if not self.circuits[oldest][1].is_closed:
                break
            self.circuits.popitem(last=False)

    def _lookup_circuit(self, session: bytes) -> CircuitCount | None:
        entry = self.circuits.get(session)
        return entry[0] if entry else None

    def pipe_for(self, conn: Connection) -> StreamPipe | None:
        """The circuit under a relayed connection (None for direct ones)."""
        tcp = conn.secure.tcp
        return tcp if isinstance(tcp, StreamPipe) else None

"""The relay side of circuit relay v2: serves ``/hop`` (RESERVE, CONNECT), opens ``/stop`` circuits,
splices the two streams and drives usage receipts; it also answers load queries (relay/load.py).

Every admission and resource decision is ``RelayPolicy``'s (relay/policy.py, sans-I/O): this module
reads and writes the streams, looks up a peer's stake (``Admission``: the allow-list and
``min_stake`` rule plus an injected, possibly async, ledger lookup), tells the policy what happened
and acts on its answers. Admitted circuits carry no Limit (no data or duration cap) unless
``RelayLimits.circuit_limit`` sets one; an announced Limit is enforced: the circuit is closed when
either direction has carried its data cap or the duration has passed (ADR 0143). Forwarding
awaits every write (the yamux windows give end-to-end back-pressure: nothing is dropped, nothing
buffered without bound) and moves whatever the stream has buffered in one write. When the policy
says a receipt is due (every ``receipt_interval_bytes`` per circuit, and when a circuit ends), the
relay asks both endpoints to co-sign a cumulative receipt and passes the signed payload to ``submit``.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection

from node.identity import Identity
from node.p2p.errors import ProtocolError
from node.p2p.host import Host, advertised_addrs
from node.p2p.multiaddr import Multiaddr

from .load import LOAD_PROTOCOL, LoadReport, serve_load
from .messages import (
    HOP_PROTOCOL,
    STOP_PROTOCOL,
    HopMessage,
    HopType,
    MessageReader,
    Peer,
    RelayMessageError,
    Reservation,
    Status,
    StopMessage,
    StopType,
    decode_hop,
    decode_stop,
    encode_hop,
    encode_stop,
    frame,
)
from .policy import AdmissionRule, CircuitRecord, RelayLimits, RelayPolicy, ReservationRecord
from .receipts import ReceiptError, build_receipt, relay_receipt_payload, request_signature
from .voucher import seal_voucher

__all__ = ["Admission", "RelayLimits", "RelayService", "ReservationRecord", "StakeLookup", "Submit",
           "read_message"]

log = logging.getLogger(__name__)

MESSAGE_TIMEOUT = 10.0
KEEP_RECEIPTS = 1024
# Most bytes one pump forwards per turn: circuits take turns in chunks of this size (fairness)
# while each chunk is still big enough to keep per-byte Python work negligible.
FORWARD_CHUNK = 256 * 1024
STOP_TIMEOUT = 10.0

StakeLookup = Callable[[str], "int | None | Awaitable[int | None]"]
Submit = Callable[[dict], Awaitable[None]]


class CircuitLimitReached(ConnectionError):
    """A circuit carried the data its announced Limit allows: the relay closes it."""


class Admission(AdmissionRule):
    """The admission rule (allow-list, or ledger stake >= ``min_stake``) with the stake lookup."""

    def __init__(self, allow_list: Collection[str] = frozenset(), min_stake: int = 0,
                 stake_of: StakeLookup | None = None) -> None:
        super().__init__(allow_list, min_stake)
        self._stake_of = stake_of

    async def stake(self, peer_id: str) -> int | None:
        """``peer_id``'s ledger stake; None if it has none, no lookup is configured, or it failed."""
        if self._stake_of is None:
            return None
        try:
            stake = self._stake_of(peer_id)
            if inspect.isawaitable(stake):
                stake = await stake
        except Exception as exc:  # a failing ledger lookup refuses, it never crashes the relay
            log.warning("relay admission lookup for %s failed: %s", peer_id, exc)
            return None
        return stake

    async def stake_if_needed(self, peer_id: str) -> int | None:
        """The stake, looked up only for a peer the allow-list does not admit already."""
        return await self.stake(peer_id) if self.needs_stake(peer_id) else None

    async def admits(self, peer_id: str) -> bool:
        return self.admits_with(peer_id, await self.stake_if_needed(peer_id))


async def read_message(stream, decoder, reader: MessageReader | None = None):
    """Read one length-prefixed relay message from ``stream`` and decode it.

    Returns ``(message, leftover bytes)``. Raises RelayMessageError (malformed, oversized, EOF) or
    TimeoutError.
    """
    reader = reader or MessageReader()
    async with asyncio.timeout(MESSAGE_TIMEOUT):
        while True:
            data = await stream.read()
            if not data:
                raise RelayMessageError("stream ended before a complete message")
            body = reader.feed(data)
            if body is not None:
                return decoder(body), reader.take_rest()


class RelayService:
    """Circuit relay v2 hop service on a Host (register with ``start``)."""

    def __init__(self, host: Host, admission: Admission, limits: RelayLimits | None = None, *,
                 chain_id: str = "dekube-local", submit: Submit | None = None,
                 public_addrs: list[str] | None = None) -> None:
        self.host = host
        self.identity: Identity = host.identity
        self.admission = admission
        self.policy = RelayPolicy(limits, admission)
        self.chain_id = chain_id
        self._submit = submit
        self._public_addrs = public_addrs
        self._tasks: set[asyncio.Task] = set()
        self._receipt_tasks: dict[CircuitRecord, asyncio.Task] = {}
        # the latest co-signed receipts (handed to submit, or only kept here when there is none)
        self.submitted: deque[dict] = deque(maxlen=KEEP_RECEIPTS)

    @property
    def limits(self) -> RelayLimits:
        return self.policy.limits

    @property
    def reservations(self) -> dict[str, ReservationRecord]:
        return self.policy.reservations

    @property
    def circuits(self) -> set[CircuitRecord]:
        return self.policy.circuits

    @property
    def counters(self) -> dict[str, int]:
        return self.policy.counters

    def start(self) -> None:
        self.host.set_handler(HOP_PROTOCOL, self.serve_hop)
        self.host.set_handler(LOAD_PROTOCOL, self._serve_load)

    async def stop(self) -> None:
        self.host.remove_handler(HOP_PROTOCOL)
        self.host.remove_handler(LOAD_PROTOCOL)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- load
    def load_report(self) -> LoadReport:
        """How full this relay is (relay/load.py): open circuits and live reservations against the limits."""
        self.policy.tick(time.time())
        return LoadReport(len(self.circuits), self.limits.max_circuits, len(self.reservations),
                          self.limits.max_reservations)

    async def _serve_load(self, stream) -> None:
        await serve_load(stream, self.load_report())

    # ---- hop
    async def serve_hop(self, stream) -> None:
        try:
            msg, _rest = await read_message(stream, decode_hop)
        except RelayMessageError as exc:
            self.policy.malformed()
            log.debug("malformed hop message from %s: %s", stream.remote_peer, exc)
            await self._reply(stream, Status.MALFORMED_MESSAGE)
            return
        except TimeoutError:
            log.debug("no hop message from %s in time", stream.remote_peer)
            stream.reset()
            return
        if msg.type == HopType.RESERVE:
            await self._reserve(stream)
        elif msg.type == HopType.CONNECT:
            await self._connect(stream, msg)
        else:
            await self._reply(stream, Status.UNEXPECTED_MESSAGE)

    async def _reply(self, stream, status: Status, **extra) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await stream.write(frame(encode_hop(HopMessage(HopType.STATUS, status=status, **extra))))
            if status != Status.OK or "reservation" in extra:
                await stream.close()

    def _relay_addrs(self, stream) -> tuple[Multiaddr, ...]:
        """Our addresses for the reservation: the configured public ones, else the listen addresses
        with a wildcard host replaced by the IP this peer reached us on."""
        if self._public_addrs is not None:
            bases = [Multiaddr.parse(a) for a in self._public_addrs]
        else:
            local = stream.connection.secure.tcp.sockname
            bound = [Multiaddr.parse(a).without_peer_id() for a in self.host.listen_addrs]
            bases = advertised_addrs(bound, local[0] if local else None)
        return tuple(a if a.peer_id is not None else a.with_peer_id(self.host.peer_id) for a in bases)

    async def _reserve(self, stream) -> None:
        peer = stream.remote_peer
        remote = stream.connection.remote_addr  # None: the reservation arrived over a relayed connection
        ip = None if remote is None else remote.direct_endpoint()[0]
        stake = None if ip is None else await self.admission.stake_if_needed(peer)
        decision = self.policy.reserve(peer, ip, stake, time.time())
        if not decision.accepted:
            log.debug("reservation of %s refused: %s", peer, decision.reason)
            await self._reply(stream, decision.status)
            return
        self._protect_reserved()
        voucher = seal_voucher(self.identity, peer, decision.expire)
        await self._reply(stream, Status.OK,
                          reservation=Reservation(decision.expire, self._relay_addrs(stream), voucher))

    def _protect_reserved(self) -> None:
        """Peers holding a live reservation are never evicted for inbound newcomers (ADR 0145):
        their relayed addresses depend on this connection."""
        self.policy.tick(time.time())
        self.host.set_protected("reservation", list(self.policy.reservations))

    # ---- connect
    async def _connect(self, stream, msg: HopMessage) -> None:
        src = stream.remote_peer
        if msg.peer is None:
            self.policy.malformed()
            await self._reply(stream, Status.MALFORMED_MESSAGE)
            return
        dst = msg.peer.peer_id
        stake = await self.admission.stake_if_needed(src)
        decision = self.policy.connect(src, dst, stake, os.urandom(16), time.time())
        if decision.circuit is None:
            log.debug("circuit %s -> %s refused: %s", src, dst, decision.reason)
            await self._reply(stream, decision.status)
            return
        circuit = decision.circuit
        try:
            stop_stream, stop_rest = await self._open_stop(circuit)
        except (ConnectionError, ProtocolError, TimeoutError, RuntimeError) as exc:
            self.policy.circuit_failed(circuit)
            log.debug("stop connect %s -> %s failed: %r", src, dst, exc)
            await self._reply(stream, Status.CONNECTION_FAILED)
            return
        try:
            await stream.write(frame(encode_hop(HopMessage(HopType.STATUS, status=Status.OK,
                                                           limit=self.limits.circuit_limit,
                                                           session=circuit.session))))
            await self._splice(circuit, stream, stop_stream, stop_rest)
        finally:
            stop_stream.reset()
            in_flight = self._receipt_tasks.pop(circuit, None)
            if self.policy.circuit_closed(circuit):
                # the final receipt outlives this handler (cancelled when the source's connection closes)
                self._spawn(self._receipt_round(circuit, after=in_flight))

    async def _open_stop(self, circuit: CircuitRecord):
        async with asyncio.timeout(STOP_TIMEOUT):
            stop = await self.host.open_stream(circuit.dst, STOP_PROTOCOL)
            try:
                await stop.write(frame(encode_stop(StopMessage(StopType.CONNECT, peer=Peer(circuit.src),
                                                               limit=self.limits.circuit_limit,
                                                               session=circuit.session))))
                answer, rest = await read_message(stop, decode_stop)
                if answer.type != StopType.STATUS or answer.status != Status.OK:
                    raise ConnectionRefusedError(f"target answered {answer.type.name} {answer.status}")
            except BaseException:
                stop.reset()
                raise
        return stop, rest

    # ---- forwarding
    async def _splice(self, circuit: CircuitRecord, src_stream, dst_stream, dst_rest: bytes) -> None:
        forward = asyncio.ensure_future(self._pump(src_stream, dst_stream, circuit, True, b""))
        backward = asyncio.ensure_future(self._pump(dst_stream, src_stream, circuit, False, dst_rest))
        try:
            async with asyncio.timeout(self.policy.duration_cap()):
                await asyncio.gather(forward, backward)
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            log.debug("circuit %s -> %s ended: %r", circuit.src, circuit.dst, exc)
            src_stream.reset()
            dst_stream.reset()
        finally:
            for task in (forward, backward):
                task.cancel()
            await asyncio.gather(forward, backward, return_exceptions=True)

    async def _pump(self, reader, writer, circuit: CircuitRecord, forward: bool, first: bytes) -> None:
        data = first
        while True:
            if data:
                allowed = self.policy.allowance(circuit, forward)
                if allowed is not None and len(data) > allowed:
                    if allowed:
                        await writer.write(data[:allowed])
                        self.policy.relayed(circuit, allowed, forward)
                    raise CircuitLimitReached(f"circuit {circuit.src} -> {circuit.dst} reached its data limit")
                await writer.write(data)
                if self.policy.relayed(circuit, len(data), forward):
                    self._receipt_tasks[circuit] = self._spawn(self._receipt_round(circuit))
            data = await reader.read(FORWARD_CHUNK)
            if not data:
                await writer.close()
                return

    # ---- receipts
    async def _receipt_round(self, circuit: CircuitRecord, after: asyncio.Task | None = None) -> None:
        """Get both endpoints' signatures on the cumulative receipt and submit it (once the round
        ``after`` has ended, when one was in flight)."""
        if after is not None:
            with contextlib.suppress(Exception):
                await after
        if not self.policy.receipt_due(circuit):
            self.policy.receipt_cancelled(circuit)
            return
        total = self.policy.receipt_started(circuit)
        receipt = build_receipt(self.host.peer_id, circuit.src, circuit.dst, circuit.session, total,
                                self.limits.price_per_mib)
        try:
            src_sig, dst_sig = await asyncio.gather(
                request_signature(self.host, circuit.src, self.chain_id, receipt),
                request_signature(self.host, circuit.dst, self.chain_id, receipt))
        except (ReceiptError, ConnectionError, ProtocolError, TimeoutError, RuntimeError) as exc:
            self.policy.receipt_ended(circuit, None)
            log.info("receipt for circuit %s -> %s not co-signed: %s", circuit.src, circuit.dst, exc)
            return
        except BaseException:
            self.policy.receipt_cancelled(circuit)
            raise
        payload = relay_receipt_payload(receipt, src_sig, dst_sig)
        self.policy.receipt_ended(circuit, total)
        self.submitted.append(payload)
        if self._submit is not None:
            try:
                await self._submit(payload)
            except Exception as exc:  # the ledger being unreachable must not stop relaying
                log.warning("submitting a relay receipt failed: %s", exc)

    def status(self) -> dict:
        return self.policy.status(time.time())

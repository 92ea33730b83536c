"""The relay side of circuit relay v2: serves ``/hop`` (RESERVE, CONNECT), opens ``/stop`` circuits,
splices the two streams and drives usage receipts.

Admission (``Admission``) decides who may reserve and who may open circuits: peers registered on
the ledger with at least ``min_stake`` (an injected lookup) or on the static allow-list. A
reservation is refused over a relayed connection, beyond ``max_reservations`` in all or
``max_reservations_per_ip`` per IP. A CONNECT needs a current reservation of the target (made
here, on the record this relay signed the voucher for) and is refused beyond the circuit limits.
Admitted circuits carry no Limit (no data or duration cap). Forwarding awaits every write (the
yamux windows give end-to-end back-pressure: nothing is dropped, nothing buffered without bound)
and moves whatever the stream has buffered in one write. Every ``receipt_interval_bytes`` per circuit,
and when a circuit ends, the relay asks both endpoints to co-sign a cumulative receipt and passes
the signed payload to ``submit``.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from node.identity import Identity
from node.p2p.errors import ProtocolError
from node.p2p.host import Host, advertised_addrs
from node.p2p.multiaddr import Multiaddr

from .messages import (
    HOP_PROTOCOL, STOP_PROTOCOL, HopMessage, HopType, MessageReader, Peer, RelayMessageError, Reservation,
    Status, StopMessage, StopType, decode_hop, decode_stop, encode_hop, encode_stop, frame,
)
from .receipts import ReceiptError, build_receipt, relay_receipt_payload, request_signature
from .voucher import seal_voucher

log = logging.getLogger(__name__)

MESSAGE_TIMEOUT = 10.0
KEEP_RECEIPTS = 1024
# Most bytes one pump forwards per turn: circuits take turns in chunks of this size (fairness)
# while each chunk is still big enough to keep per-byte Python work negligible.
FORWARD_CHUNK = 256 * 1024
STOP_TIMEOUT = 10.0

StakeLookup = Callable[[str], "int | None | Awaitable[int | None]"]
Submit = Callable[[dict], Awaitable[None]]


@dataclass
class RelayLimits:
    reservation_ttl: int = 3600           # seconds a reservation (and its voucher) lasts
    max_reservations: int = 4096
    max_reservations_per_ip: int = 16
    max_circuits: int = 4096
    max_circuits_per_peer: int = 64        # circuits a peer has open, as source or target
    receipt_interval_bytes: int = 64 << 20
    price_per_mib: int = 1


class Admission:
    """Ledger-registered peers with enough stake, or peers on a static allow-list, are admitted."""

    def __init__(self, allow_list: set[str] | frozenset[str] = frozenset(), min_stake: int = 0,
                 stake_of: StakeLookup | None = None) -> None:
        self.allow_list = set(allow_list)
        self.min_stake = min_stake
        self._stake_of = stake_of

    async def admits(self, peer_id: str) -> bool:
        if peer_id in self.allow_list:
            return True
        if self._stake_of is None:
            return False
        try:
            stake = self._stake_of(peer_id)
            if inspect.isawaitable(stake):
                stake = await stake
        except Exception as exc:  # a failing ledger lookup refuses, it never crashes the relay
            log.warning("relay admission lookup for %s failed: %s", peer_id, exc)
            return False
        return stake is not None and stake >= self.min_stake


@dataclass
class ReservationRecord:
    peer: str
    expire: int
    ip: str


@dataclass(eq=False)
class Circuit:
    src: str
    dst: str
    session: bytes
    started: float = field(default_factory=time.monotonic)
    src_to_dst: int = 0
    dst_to_src: int = 0
    receipted_bytes: int = 0
    receipt: dict | None = None  # the latest fully co-signed receipt payload
    receipt_task: asyncio.Task | None = None

    @property
    def bytes_total(self) -> int:
        return self.src_to_dst + self.dst_to_src


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
        self.limits = limits or RelayLimits()
        self.chain_id = chain_id
        self._submit = submit
        self._public_addrs = public_addrs
        self.reservations: dict[str, ReservationRecord] = {}
        self.circuits: set[Circuit] = set()
        self._tasks: set[asyncio.Task] = set()
        # the latest co-signed receipts (handed to submit, or only kept here when there is none)
        self.submitted: deque[dict] = deque(maxlen=KEEP_RECEIPTS)
        self.counters = {"reservations_refused": 0, "circuits_refused": 0, "malformed": 0,
                         "receipts": 0, "receipts_failed": 0, "circuits_closed": 0, "bytes_closed_circuits": 0}

    def start(self) -> None:
        self.host.set_handler(HOP_PROTOCOL, self.serve_hop)

    async def stop(self) -> None:
        self.host.remove_handler(HOP_PROTOCOL)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- hop
    async def serve_hop(self, stream) -> None:
        try:
            msg, _rest = await read_message(stream, decode_hop)
        except RelayMessageError as exc:
            self.counters["malformed"] += 1
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

    def _live_reservation(self, peer: str) -> ReservationRecord | None:
        record = self.reservations.get(peer)
        if record is not None and record.expire <= time.time():
            del self.reservations[peer]
            return None
        return record

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
        remote = stream.connection.remote_addr
        if remote is None:  # the reservation itself arrived over a relayed connection
            self.counters["reservations_refused"] += 1
            await self._reply(stream, Status.PERMISSION_DENIED)
            return
        if not await self.admission.admits(peer):
            self.counters["reservations_refused"] += 1
            await self._reply(stream, Status.PERMISSION_DENIED)
            return
        ip = remote.tcp_endpoint()[0]
        now = time.time()
        live = [r for r in self.reservations.values() if r.expire > now and r.peer != peer]
        if (len(live) >= self.limits.max_reservations
                or sum(1 for r in live if r.ip == ip) >= self.limits.max_reservations_per_ip):
            self.counters["reservations_refused"] += 1
            await self._reply(stream, Status.RESOURCE_LIMIT_EXCEEDED)
            return
        self.reservations = {r.peer: r for r in live}
        expire = int(now) + self.limits.reservation_ttl
        self.reservations[peer] = ReservationRecord(peer, expire, ip)
        voucher = seal_voucher(self.identity, peer, expire)
        await self._reply(stream, Status.OK, reservation=Reservation(expire, self._relay_addrs(stream), voucher))

    # ---- connect
    def _circuits_of(self, peer: str) -> int:
        return sum(1 for c in self.circuits if peer in (c.src, c.dst))

    async def _connect(self, stream, msg: HopMessage) -> None:
        src = stream.remote_peer
        if msg.peer is None:
            self.counters["malformed"] += 1
            await self._reply(stream, Status.MALFORMED_MESSAGE)
            return
        dst = msg.peer.peer_id
        refusal = None
        if not await self.admission.admits(src):
            refusal = Status.PERMISSION_DENIED
        elif dst == src or self._live_reservation(dst) is None:
            refusal = Status.NO_RESERVATION
        elif (len(self.circuits) >= self.limits.max_circuits
              or self._circuits_of(src) >= self.limits.max_circuits_per_peer
              or self._circuits_of(dst) >= self.limits.max_circuits_per_peer):
            refusal = Status.RESOURCE_LIMIT_EXCEEDED
        if refusal is not None:
            self.counters["circuits_refused"] += 1
            await self._reply(stream, refusal)
            return
        circuit = Circuit(src, dst, os.urandom(16))
        self.circuits.add(circuit)
        try:
            stop_stream, stop_rest = await self._open_stop(circuit)
        except (ConnectionError, ProtocolError, TimeoutError, RuntimeError) as exc:
            self.circuits.discard(circuit)
            self.counters["circuits_refused"] += 1
            log.debug("stop connect %s -> %s failed: %r", src, dst, exc)
            await self._reply(stream, Status.CONNECTION_FAILED)
            return
        try:
            await stream.write(frame(encode_hop(HopMessage(HopType.STATUS, status=Status.OK,
                                                           session=circuit.session))))
            await self._splice(circuit, stream, stop_stream, stop_rest)
        finally:
            self.circuits.discard(circuit)
            self.counters["circuits_closed"] += 1
            self.counters["bytes_closed_circuits"] += circuit.bytes_total
            stop_stream.reset()
            # the final receipt outlives this handler (cancelled when the source's connection closes)
            self._spawn(self._receipt_round(circuit))

    async def _open_stop(self, circuit: Circuit):
        async with asyncio.timeout(STOP_TIMEOUT):
            stop = await self.host.open_stream(circuit.dst, STOP_PROTOCOL)
            try:
                await stop.write(frame(encode_stop(StopMessage(StopType.CONNECT, peer=Peer(circuit.src),
                                                               session=circuit.session))))
                answer, rest = await read_message(stop, decode_stop)
                if answer.type != StopType.STATUS or answer.status != Status.OK:
                    raise ConnectionRefusedError(f"target answered {answer.type.name} {answer.status}")
            except BaseException:
                stop.reset()
                raise
        return stop, rest

    # ---- forwarding
    async def _splice(self, circuit: Circuit, src_stream, dst_stream, dst_rest: bytes) -> None:
        forward = asyncio.ensure_future(self._pump(src_stream, dst_stream, circuit, True, b""))
        backward = asyncio.ensure_future(self._pump(dst_stream, src_stream, circuit, False, dst_rest))
        try:
            await asyncio.gather(forward, backward)
        except (ConnectionError, RuntimeError) as exc:
            log.debug("circuit %s -> %s ended: %r", circuit.src, circuit.dst, exc)
            src_stream.reset()
            dst_stream.reset()
        finally:
            for task in (forward, backward):
                task.cancel()
            await asyncio.gather(forward, backward, return_exceptions=True)

    async def _pump(self, reader, writer, circuit: Circuit, forward: bool, first: bytes) -> None:
        data = first
        while True:
            if data:
                await writer.write(data)
                if forward:
                    circuit.src_to_dst += len(data)
                else:
                    circuit.dst_to_src += len(data)
                if circuit.bytes_total - circuit.receipted_bytes >= self.limits.receipt_interval_bytes:
                    self._start_receipt_round(circuit)
            data = await reader.read(FORWARD_CHUNK)
            if not data:
                await writer.close()
                return

    # ---- receipts
    def _start_receipt_round(self, circuit: Circuit) -> None:
        if circuit.receipt_task is not None and not circuit.receipt_task.done():
            return
        circuit.receipted_bytes = circuit.bytes_total
        circuit.receipt_task = self._spawn(self._receipt_round(circuit))

    async def _receipt_round(self, circuit: Circuit) -> None:
        """Get both endpoints' signatures on the cumulative receipt and submit it."""
        if circuit.receipt_task is not None and circuit.receipt_task is not asyncio.current_task():
            with contextlib.suppress(Exception):
                await circuit.receipt_task
        total = circuit.bytes_total
        if total == 0 or (circuit.receipt is not None and circuit.receipt["receipt"]["bytes_total"] >= total):
            return
        circuit.receipted_bytes = total
        receipt = build_receipt(self.host.peer_id, circuit.src, circuit.dst, circuit.session, total,
                                self.limits.price_per_mib)
        try:
            src_sig, dst_sig = await asyncio.gather(
                request_signature(self.host, circuit.src, self.chain_id, receipt),
                request_signature(self.host, circuit.dst, self.chain_id, receipt))
        except (ReceiptError, ConnectionError, ProtocolError, TimeoutError, RuntimeError) as exc:
            self.counters["receipts_failed"] += 1
            log.info("receipt for circuit %s -> %s not co-signed: %s", circuit.src, circuit.dst, exc)
            return
        payload = relay_receipt_payload(receipt, src_sig, dst_sig)
        circuit.receipt = payload
        self.submitted.append(payload)
        self.counters["receipts"] += 1
        if self._submit is not None:
            try:
                await self._submit(payload)
            except Exception as exc:  # the ledger being unreachable must not stop relaying
                log.warning("submitting a relay receipt failed: %s", exc)

    def status(self) -> dict:
        now = time.time()
        return {
            "reservations": sum(1 for r in self.reservations.values() if r.expire > now),
            "circuits": len(self.circuits),
            "bytes_relayed": sum(c.bytes_total for c in self.circuits),
            **self.counters,
        }

"""The relay's admission and resource policy as a sans-I/O state machine (no sockets, no clock).

``RelayPolicy`` is told what happens — a reservation request from a peer (with the IP it came from
and its ledger stake), a circuit request, bytes relayed on a circuit, a receipt round ending, a
circuit closing, the clock moving on — and answers with decisions: accept or deny with a circuit
relay v2 status and a reason, the expiry of an accepted reservation, whether a usage receipt is due,
which reservations expired. It keeps the reservations and open circuits, the per-peer and per-IP
limits, and the counters and totals the relay reports. ``relay/service.py`` does the stream I/O and
the stake lookups and consults it (the shape of rust-libp2p's relay ``Behaviour``).

Rules (ADR 0060, 0062): a peer is admitted if it is on the allow-list or its ledger stake is at least
``min_stake``. A reservation is refused over a relayed connection, to a peer not admitted, and
beyond ``max_reservations`` live reservations in all or ``max_reservations_per_ip`` per IP (a
peer's own earlier reservation does not count against it; renewing replaces it). A circuit needs an
admitted source and a live reservation of another peer as target, and is refused beyond
``max_circuits`` open circuits or ``max_circuits_per_peer`` per endpoint. A receipt round is due
every ``receipt_interval_bytes`` relayed on a circuit, never two at once, and a final one when a
circuit closes with bytes not yet covered by a co-signed receipt.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .messages import Limit, Status


@dataclass
class RelayLimits:
    reservation_ttl: int = 3600           # seconds a reservation (and its voucher) lasts
    max_reservations: int = 4096
    max_reservations_per_ip: int = 16
    max_circuits: int = 4096
    max_circuits_per_peer: int = 64        # circuits a peer has open, as source or target
    receipt_interval_bytes: int = 64 << 20
    price_per_mib: int = 1
    # the Limit announced on each circuit (HOP STATUS and STOP CONNECT); None: unlimited, as our relay
    # carries bulk for registered peers. Endpoints treat a capped circuit as signalling-only (ADR 0143).
    circuit_limit: Limit | None = None


class AdmissionRule:
    """Who may reserve and open circuits: peers on ``allow_list`` (a live set: changes apply at once)
    or with a ledger stake of at least ``min_stake``."""

    def __init__(self, allow_list: Collection[str] = frozenset(), min_stake: int = 0) -> None:
        self.allow_list = set(allow_list)
        self.min_stake = min_stake

    def needs_stake(self, peer: str) -> bool:
        """Whether admitting ``peer`` depends on its stake (so the driver has to look it up)."""
        return peer not in self.allow_list

    def admits_with(self, peer: str, stake: int | None) -> bool:
        """``stake`` None: not registered, or the lookup failed (both refuse)."""
        return peer in self.allow_list or (stake is not None and stake >= self.min_stake)


@dataclass
class ReservationRecord:
    peer: str
    expire: int
    ip: str


@dataclass(eq=False)
class CircuitRecord:
    """An open (or just closed) circuit and its byte counts."""
    src: str
    dst: str
    session: bytes
    started: float = 0.0
    src_to_dst: int = 0
    dst_to_src: int = 0
    receipted_bytes: int = 0    # bytes_total when the latest receipt round started
    signed_bytes: int = 0       # bytes_total of the latest co-signed receipt
    receipt_pending: bool = False

    @property
    def bytes_total(self) -> int:
        return self.src_to_dst + self.dst_to_src


@dataclass(frozen=True)
class Decision:
    """Accept (``status`` OK) or deny, with the status to answer and a reason for logs and tests."""
    status: Status
    reason: str = ""
    expire: int = 0                        # an accepted reservation's expiry (unix seconds)
    circuit: CircuitRecord | None = None   # an accepted circuit

    @property
    def accepted(self) -> bool:
        return self.status == Status.OK


class RelayPolicy:
    """Reservations, circuits, limits and counters of one relay; every method is pure bookkeeping."""

    def __init__(self, limits: RelayLimits | None = None, admission: AdmissionRule | None = None) -> None:
        self.limits = limits or RelayLimits()
        self.admission = admission or AdmissionRule()
        self.reservations: dict[str, ReservationRecord] = {}
        self.circuits: set[CircuitRecord] = set()
        self.counters = {"reservations_refused": 0, "circuits_refused": 0, "malformed": 0,
                         "receipts": 0, "receipts_failed": 0, "circuits_closed": 0, "bytes_closed_circuits": 0}

    # ---- clock
    def tick(self, now: float) -> list[str]:
        """Drop the reservations expired at ``now``; returns their peers."""
        expired = [peer for peer, r in self.reservations.items() if r.expire <= now]
        for peer in expired:
            del self.reservations[peer]
        return expired

    def live_reservation(self, peer: str, now: float) -> ReservationRecord | None:
        record = self.reservations.get(peer)
        if record is not None and record.expire <= now:
            del self.reservations[peer]
            return None
        return record

    # ---- reservations
    def reserve(self, peer: str, ip: str | None, stake: int | None, now: float) -> Decision:
        """A RESERVE from ``peer`` on a direct connection from ``ip`` (None: over a relayed one)."""
        if ip is None:
            return self._refuse_reservation(Status.PERMISSION_DENIED, "reservation over a relayed connection")
        if not self.admission.admits_with(peer, stake):
            return self._refuse_reservation(Status.PERMISSION_DENIED, "not admitted (allow-list or stake)")
        self.tick(now)
        others = [r for r in self.reservations.values() if r.peer != peer]
        if len(others) >= self.limits.max_reservations:
            return self._refuse_reservation(Status.RESOURCE_LIMIT_EXCEEDED, "reservation limit")
        if sum(1 for r in others if r.ip == ip) >= self.limits.max_reservations_per_ip:
            return self._refuse_reservation(Status.RESOURCE_LIMIT_EXCEEDED, f"reservation limit for {ip}")
        expire = int(now) + self.limits.reservation_ttl
        self.reservations[peer] = ReservationRecord(peer, expire, ip)
        return Decision(Status.OK, expire=expire)

    def _refuse_reservation(self, status: Status, reason: str) -> Decision:
        self.counters["reservations_refused"] += 1
        return Decision(status, reason)

    # ---- circuits
    def circuits_of(self, peer: str) -> int:
        return sum(1 for c in self.circuits if peer in (c.src, c.dst))

    def connect(self, src: str, dst: str, src_stake: int | None, session: bytes, now: float) -> Decision:
        """A CONNECT from ``src`` to ``dst``; an accepted circuit is open until ``circuit_failed`` or
        ``circuit_closed``. ``now`` is wall-clock time (reservation expiry)."""
        if not self.admission.admits_with(src, src_stake):
            return self._refuse_circuit(Status.PERMISSION_DENIED, "source not admitted")
        if dst == src or self.live_reservation(dst, now) is None:
            return self._refuse_circuit(Status.NO_RESERVATION, "no reservation of the target here")
        if len(self.circuits) >= self.limits.max_circuits:
            return self._refuse_circuit(Status.RESOURCE_LIMIT_EXCEEDED, "circuit limit")
        if (self.circuits_of(src) >= self.limits.max_circuits_per_peer
                or self.circuits_of(dst) >= self.limits.max_circuits_per_peer):
            return self._refuse_circuit(Status.RESOURCE_LIMIT_EXCEEDED, "circuit limit per peer")
        circuit = CircuitRecord(src, dst, session, started=now)
        self.circuits.add(circuit)
        return Decision(Status.OK, circuit=circuit)

    def _refuse_circuit(self, status: Status, reason: str) -> Decision:
        self.counters["circuits_refused"] += 1
        return Decision(status, reason)

    def circuit_failed(self, circuit: CircuitRecord) -> None:
        """The target could not be reached (stop CONNECT failed): the circuit counts as refused."""
        self.circuits.discard(circuit)
        self.counters["circuits_refused"] += 1

    def circuit_closed(self, circuit: CircuitRecord) -> bool:
        """The circuit ended; returns whether a final receipt round is due for it (once any round
        in flight has ended: ask ``receipt_due`` again then)."""
        if circuit in self.circuits:
            self.circuits.discard(circuit)
            self.counters["circuits_closed"] += 1
            self.counters["bytes_closed_circuits"] += circuit.bytes_total
        return self.receipt_due(circuit)

    def malformed(self) -> None:
        self.counters["malformed"] += 1

    # ---- bytes and receipts
    def relayed(self, circuit: CircuitRecord, nbytes: int, forward: bool) -> bool:
        """``nbytes`` went src -> dst (``forward``) or back; True when a receipt round should start
        now (``receipt_started`` is then implied)."""
        if forward:
            circuit.src_to_dst += nbytes
        else:
            circuit.dst_to_src += nbytes
        if (circuit.receipt_pending
                or circuit.bytes_total - circuit.receipted_bytes < self.limits.receipt_interval_bytes):
            return False
        self.receipt_started(circuit)
        return True

    def allowance(self, circuit: CircuitRecord, forward: bool) -> int | None:
        """Bytes ``circuit`` may still carry src -> dst (``forward``) or back under the announced
        Limit's data cap (None: no cap). At 0 the relay closes the circuit, as circuit v2 says."""
        cap = self.limits.circuit_limit.data if self.limits.circuit_limit is not None else None
        if cap is None:
            return None
        return max(0, cap - (circuit.src_to_dst if forward else circuit.dst_to_src))

    def duration_cap(self) -> int | None:
        """Seconds a circuit may stay open under the announced Limit (None: no cap)."""
        return self.limits.circuit_limit.duration if self.limits.circuit_limit is not None else None

    def receipt_due(self, circuit: CircuitRecord) -> bool:
        """Whether bytes of ``circuit`` are not yet covered by a co-signed receipt."""
        total = circuit.bytes_total
        return total > 0 and circuit.signed_bytes < total

    def receipt_started(self, circuit: CircuitRecord) -> int:
        """A receipt round starts for the bytes so far; returns the total it covers."""
        circuit.receipt_pending = True
        circuit.receipted_bytes = circuit.bytes_total
        return circuit.receipted_bytes

    def receipt_ended(self, circuit: CircuitRecord, signed_total: int | None) -> None:
        """The round ended: both endpoints co-signed ``signed_total`` bytes, or (None) it failed."""
        circuit.receipt_pending = False
        if signed_total is None:
            self.counters["receipts_failed"] += 1
            return
        circuit.signed_bytes = max(circuit.signed_bytes, signed_total)
        self.counters["receipts"] += 1

    def receipt_cancelled(self, circuit: CircuitRecord) -> None:
        """The round was cut short (the relay stops): neither signed nor failed."""
        circuit.receipt_pending = False

    # ---- totals
    def status(self, now: float) -> dict:
        self.tick(now)
        return {
            "reservations": len(self.reservations),
            "circuits": len(self.circuits),
            "bytes_relayed": sum(c.bytes_total for c in self.circuits),
            **self.counters,
        }

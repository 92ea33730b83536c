"""Which relay to use: the least loaded one, bounded against relays that understate their load
(ADR 0227). Sans-I/O: the caller passes the clock, the reports (relay/load.py) and its own counts.

A relay's *effective load* is the utilization it reports (its circuit count raised by the circuits
this client opened through it since the report, and to at least the circuits this client has through
it), with a claimed capacity credited up to ``MAX_CREDITED_CIRCUITS`` / ``_RESERVATIONS``, floored
at ``IDLE``; a relay that never answered, or whose report is older than ``REPORT_MAX_AGE_S``, counts
as ``UNKNOWN``. Claims below ``IDLE`` buy
nothing: every relay with room looks alike, so a relay that says "0 load" is as good as an honest
one at a quarter of its capacity, no better.

- New circuits (``rank_relays``): relays that failed recently go last; the relays within ``MARGIN``
  of the least effective load are equally good and come first, the one with the fewest of our open
  circuits first (so our circuits spread evenly over them: a relay among them gets its fair share,
  whatever it claims); the others follow, least loaded first.
- Reservations (``rank_for_reservation``): the same equally-good set first, the lowest round-trip
  time first within it. A held reservation moves (``move``) only when a spare relay's fresh report
  is at least ``MOVE_MARGIN`` below the busiest held relay's and that reservation has been held
  ``MIN_HOLD_S``: the hysteresis keeps a node from flapping between relays (each move changes the
  relayed addresses in its ledger record).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from .load import LoadReport
from .policy import RelayLimits

IDLE = 0.25              # reported loads below this count as this
UNKNOWN = 0.5            # a relay without a usable report: assumed half full
MARGIN = 0.15            # loads within this of the least are equally good
MOVE_MARGIN = 0.3        # a reservation moves only to a relay this much less loaded...
MIN_HOLD_S = 600.0       # ...and only after it was held this long
REPORT_TTL_S = 30.0      # a report older than this is asked for again
REPORT_MAX_AGE_S = 300.0 # a report older than this is not used
MAX_KNOWN = 1024         # relays remembered (peers' records may name any number)
# the most circuits and reservations a relay's claimed capacity is credited with (our relay's default limits)
MAX_CREDITED_CIRCUITS = RelayLimits().max_circuits
MAX_CREDITED_RESERVATIONS = RelayLimits().max_reservations

T = TypeVar("T")


@dataclass(frozen=True)
class _Known:
    report: LoadReport
    at: float
    own_then: int   # our open circuits through the relay when it reported


class RelayLoads:
    """The latest load report of each relay this client asked, with when it came."""

    def __init__(self) -> None:
        self._known: OrderedDict[str, _Known] = OrderedDict()

    def record(self, relay: str, report: LoadReport, now: float, own_circuits: int = 0) -> None:
        """``report`` came from ``relay`` at ``now``, while we had ``own_circuits`` open through it."""
        self._known[relay] = _Known(report, now, own_circuits)
        self._known.move_to_end(relay)
        while len(self._known) > MAX_KNOWN:
            self._known.popitem(last=False)

    def forget(self, relay: str) -> None:
        """The relay did not answer: its load is unknown again."""
        self._known.pop(relay, None)

    def stale(self, relays: Sequence[str], now: float) -> list[str]:
        """Those of ``relays`` to ask again (never asked, or asked over ``REPORT_TTL_S`` ago)."""
        return [r for r in relays if r not in self._known or now - self._known[r].at > REPORT_TTL_S]

    def fresh(self, relay: str, now: float) -> bool:
        known = self._known.get(relay)
        return known is not None and now - known.at <= REPORT_TTL_S

    def effective(self, relay: str, now: float, own_circuits: int = 0) -> float:
        known = self._known.get(relay)
        if known is None or now - known.at > REPORT_MAX_AGE_S:
            return UNKNOWN
        report = known.report
        # ours opened since the report are on top of it; and it cannot carry fewer circuits than ours
        circuits = max(report.circuits + max(0, own_circuits - known.own_then), own_circuits)
        credited = replace(report, circuits=circuits, max_circuits=min(report.max_circuits, MAX_CREDITED_CIRCUITS),
                           max_reservations=min(report.max_reservations, MAX_CREDITED_RESERVATIONS))
        return max(IDLE, credited.utilization)

    def utilization(self, relay: str) -> float | None:
        """The relay's own claim, unbounded by the rules above (for status pages)."""
        known = self._known.get(relay)
        return None if known is None else known.report.utilization


def _bands(loads: Sequence[float]) -> list[tuple[bool, float]]:
    """Per relay: (outside the equally-good set, load used to order those outside it)."""
    best = min(loads, default=0.0)
    return [(load > best + MARGIN, load if load > best + MARGIN else 0.0) for load in loads]


def rank_relays(relays: Sequence[str], loads: Sequence[float], own_circuits: Mapping[str, int],
                failed: Callable[[str], bool]) -> list[int]:
    """The indices of ``relays`` (with their effective ``loads``) in the order new circuits should
    try them."""
    usable = [load for relay, load in zip(relays, loads) if not failed(relay)]
    best = min(usable or loads, default=0.0)
    keyed = []
    for index, (relay, load) in enumerate(zip(relays, loads)):
        outside = load > best + MARGIN
        keyed.append((failed(relay), outside, load if outside else 0.0, own_circuits.get(relay, 0), index))
    return [key[-1] for key in sorted(keyed)]


def rank_for_reservation(candidates: Sequence[tuple[float, T]], loads: Sequence[float]) -> list[tuple[float, T]]:
    """``candidates`` ((rtt, relay address) pairs, with their effective ``loads``) in the order to reserve on them."""
    keyed = sorted(zip(_bands(loads), candidates, range(len(loads))), key=lambda item: (item[0], item[1][0], item[2]))
    return [candidate for _, candidate, _ in keyed]


def move(held: Mapping[str, tuple[float, float]], spare: Mapping[str, float], now: float) -> tuple[str, str] | None:
    """The (held relay to leave, spare relay to reserve on) that is worth a move, if any.

    ``held``: relay -> (effective load, when its reservation was first granted); ``spare``: relay ->
    effective load, from fresh reports only (a relay we know nothing about is not worth a move)."""
    movable = [(load, relay) for relay, (load, since) in held.items() if now - since >= MIN_HOLD_S]
    if not movable or not spare:
        return None
    worst_load, worst = max(movable)
    best_load, best = min((load, relay) for relay, load in spare.items())
    if worst_load - best_load >= MOVE_MARGIN:
        return worst, best
    return None

"""What every seed must satisfy.

For every round: all honest survivors that committed it hold bitwise-identical results over the
same participant set; that result is the float32 mean, summed in sorted member order, of exactly
the participants' contributions; every member still alive finished every round (nothing waits
forever); and in a round where no member has been faulty yet, nobody is left out.

Once some member has been faulty (killed, frozen, sending garbage), the protocol does not promise
that only faulty members are left out: members whose VIEWs differ (one saw a garbage frame or
gave up on a frozen member's VIEW sooner than the others) plan over different member sets, and
the mismatch may end only when some member times out on an honest one (docs/adr/0116). Such
exclusions are counted in `Outcome.honest_left_out`, not reported as violations.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .faults import Scenario
from .flows import mean_in_order
from .member import RoundRecord, result_digest


@dataclass
class Outcome:
    violations: list[str] = field(default_factory=list)
    honest_left_out: list[str] = field(default_factory=list)  # (round, member): allowed, counted


def check(sc: Scenario, records: list[RoundRecord], values: Callable[[str, int], np.ndarray],
          killed_at: dict[str, float]) -> Outcome:
    outcome = Outcome()
    problems = outcome.violations
    by_round: dict[int, dict[str, RoundRecord]] = {}
    for rec in records:
        if rec.round_id in by_round.get(rec.round_id, {}):
            problems.append(f"{rec.member} ended round {rec.round_id} twice")
        by_round.setdefault(rec.round_id, {})[rec.member] = rec
    killed = set(killed_at)
    for member in sc.members:
        if member in killed:
            continue
        missing = [r for r in range(sc.rounds) if member not in by_round.get(r, {})]
        if missing:
            problems.append(f"{member} (alive) never finished rounds {missing}: a wait did not terminate")
    for round_id in range(sc.rounds):
        ended = by_round.get(round_id, {})
        honest = {m: rec for m, rec in ended.items() if not _garbage(sc, m, round_id)}
        committers = {m: rec.committed for m, rec in honest.items() if rec.committed is not None}
        outcomes = {(c.participants, c.result.tobytes()) for c in committers.values()}
        if len(outcomes) > 1:
            detail = ", ".join(f"{m}: {','.join(c.participants)} {result_digest(c.result)}"
                               for m, c in sorted(committers.items()))
            problems.append(f"round {round_id}: survivors disagree: {detail}")
            continue
        if not committers:
            continue
        committed = next(iter(committers.values()))
        expected = mean_in_order([values(m, round_id) for m in committed.participants])
        if expected.tobytes() != committed.result.tobytes():
            problems.append(f"round {round_id}: result is not the mean of {','.join(committed.participants)}")
        end = max(rec.finished_at for rec in honest.values())
        disturbed = not all(_clean(sc, killed_at, m, round_id, end) for m in sc.members)
        for member in sc.members:
            if member in killed and member not in ended or not _clean(sc, killed_at, member, round_id, end):
                continue
            if member not in committed.participants:
                rec = ended.get(member)
                what = (f"round {round_id}: never-faulty {member} left out "
                        f"({committed.excluded.get(member, 'no reason')}); it ended with "
                        f"{'the same result' if member in committers else rec.error if rec else 'no outcome'}")
                (outcome.honest_left_out if disturbed else problems).append(what)
            elif member not in committers:
                rec = ended.get(member)
                problems.append(f"round {round_id}: participant {member} did not commit: "
                                f"{rec.error if rec else 'no outcome'}")
    return outcome


def _garbage(sc: Scenario, member: str, round_id: int) -> bool:
    return any(f.member == member and f.kind == "garbage" and f.from_round <= round_id for f in sc.faults)


def _clean(sc: Scenario, killed_at: dict[str, float], member: str, round_id: int, end: float) -> bool:
    """Whether `member` had not been faulty by time `end` (the end of round `round_id`)."""
    if killed_at.get(member, end + 1) <= end:
        return False
    for f in sc.faults:
        if f.member != member:
            continue
        if f.kind == "garbage" and f.from_round <= round_id:
            return False
        if f.kind in ("stall", "outage") and f.at <= end:
            return False
    return True

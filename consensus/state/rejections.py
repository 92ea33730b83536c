"""Task griefing rules: what rejecting a task costs (docs/adr/0192). The bandwidth ranking trusts is
consensus/state/bandwidth.py's (ADR 0219).

Rejection (`reject_payouts`, `lone_rejecters`, `outvoted_rejecters`, `recent_bars`): a rejection is
*corroborated* when at least `CORROBORATING_REJECTERS` workers of the crew rejected and they are a
strict majority; only then is ``reject_fee`` kept from the escrow, split among those rejecters. A
lone rejection (a crew of one, or the only rejecter of a crew it cannot outvote) returns the whole
escrow less relay claims to the owner, costs the rejecter `REPUTATION_LONE_REJECTION`, and bars it
for `REJECT_COOLDOWN_BLOCKS` from that owner's tasks; `MAX_LONE_REJECTIONS` lone rejections within
the window bar it from every task. A rejecter *outvoted* by a crew that went on to train the task and
was paid (ADR 0197) is charged the same: the settlement's no-show penalty (`REPUTATION_NO_SHOW`, equal
to `REPUTATION_LONE_REJECTION`) and the same bars, its rejection counting as a lone one. The bars are
derived from the ended tasks themselves (status, worker, owner, assignment height), so they need no
stored table.
"""
from __future__ import annotations

from consensus.state.records import Task, TaskStatus
from consensus.state.store import LedgerState

CORROBORATING_REJECTERS = 2
REPUTATION_LONE_REJECTION = -5
REJECT_COOLDOWN_BLOCKS = 3600
MAX_LONE_REJECTIONS = 3


def corroborated(task: Task) -> bool:
    """Whether the task's rejection was agreed by enough of its crew to pay the reject fee."""
    return (len(task.rejections) >= CORROBORATING_REJECTERS
            and 2 * len(task.rejections) > int(task.spec["workers"]))   # of its seats (joiners cannot reject)


def reject_payouts(task: Task, fee: int) -> dict[str, int]:
    """What the rejecters of a task ending ``rejected`` get from ``fee``: an equal share each when
    corroborated, nothing for a lone rejecter (the owner keeps it)."""
    if not corroborated(task):
        return {}
    rejecters = sorted(task.rejections)
    return {worker: fee // len(rejecters) for worker in rejecters}


def lone_rejecters(task: Task) -> list[str]:
    """The rejecters of a rejected task whose rejection nobody corroborated."""
    return [] if corroborated(task) else sorted(task.rejections)


def outvoted_rejecters(task: Task) -> list[str]:
    """The rejecters of a task the rest of its crew trained and was paid for: the task was trainable."""
    return sorted(task.rejections) if task.status == TaskStatus.PAID else []


def griefing_rejecters(task: Task) -> list[str]:
    """The rejecters of an ended task whose rejection counts against them (lone or outvoted)."""
    if task.status == TaskStatus.REJECTED:
        return lone_rejecters(task)
    return outvoted_rejecters(task)


class Bars:
    """Who may not be given whose task at one height (`recent_bars`)."""

    def __init__(self) -> None:
        self.by_owner: dict[str, set[str]] = {}
        self.everywhere: set[str] = set()

    def allowed(self, owner: str, pool: list[str]) -> list[str]:
        """``pool`` less the workers barred from ``owner``'s tasks."""
        barred = self.everywhere | self.by_owner.get(owner, set())
        return [peer_id for peer_id in pool if peer_id not in barred] if barred else pool


def recent_bars(state: LedgerState, height: int) -> Bars:
    """The bars at ``height``: a worker with a lone or outvoted rejection of an owner's task assigned
    within the cooldown window is barred from that owner's tasks; one with `MAX_LONE_REJECTIONS` such
    rejections (of anyone's tasks) from every task."""
    since = height - REJECT_COOLDOWN_BLOCKS
    bars = Bars()
    counts: dict[str, int] = {}
    for task in state.tasks.values():
        if not task.rejections or task.assigned_height <= since:
            continue
        for worker in griefing_rejecters(task):
            bars.by_owner.setdefault(task.owner, set()).add(worker)
            counts[worker] = counts.get(worker, 0) + 1
            if counts[worker] >= MAX_LONE_REJECTIONS:
                bars.everywhere.add(worker)
    return bars

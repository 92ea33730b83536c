"""The compute role's part of the provider dashboard (node/dashboard, docs/adr/0195): from the ledger's
task records, what this node was paid per task and where it was slashed and why. Pure functions of
``dkb_listTasks`` answers, decoded as `consensus.task_info.TaskInfo`."""
from __future__ import annotations

from typing import Any

from consensus.task_info import SlotOutcome, TaskInfo, TaskStatus

ENDED = (TaskStatus.PAID, TaskStatus.REJECTED)


def payouts_to(tasks: list[TaskInfo], me: str) -> list[dict[str, Any]]:
    """[{"task_id", "status", "amount"}] for the ended tasks that paid ``me`` something."""
    out = []
    for task in tasks:
        amount = int(task.payouts.get(me, 0))
        if task.status in ENDED and amount:
            out.append({"task_id": task.task_id, "status": task.status, "amount": amount})
    return out


def slashes_of(tasks: list[TaskInfo], me: str) -> list[dict[str, Any]]:
    """[{"task_id", "slot", "reason"}]: audit slots decided against ``me``, as a worker whose segment did not
    replay to its committed hash, or as a verifier or referee whose answer the verdict contradicts."""
    out: list[dict[str, Any]] = []
    for task in tasks:
        for slot in task.slots:
            verdict = slot.verdict
            if slot.worker == me and slot.outcome == SlotOutcome.GUILTY:
                out.append({"task_id": task.task_id, "slot": slot.slot,
                            "reason": f"segment {slot.segment} did not replay to the committed hash "
                                      f"(evidence {(verdict.evidence if verdict else '') or 'none'})"})
            if slot.outcome not in SlotOutcome.PAID or verdict is None:
                continue
            answers = [(v.answer, "verifier") for v in slot.verifiers if v.verifier == me]
            answers += [(r.vote, "referee") for r in slot.referees if r.referee == me]
            for answer, kind in answers:
                if answer is not None and answer.key != verdict.key:
                    out.append({"task_id": task.task_id, "slot": slot.slot,
                                "reason": f"as {kind}: answered match={answer.match}, the verdict was "
                                          f"match={verdict.match}"})
    return out

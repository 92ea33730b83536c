"""The compute role's part of the provider dashboard (node/dashboard, docs/adr/0195): from the ledger's
task records, what this node was paid per task (and in total over time), where it was slashed and why (with the
explorer's page of the task as the evidence), the audits it took part in, and the tasks it owns
(docs/adr/0198). Pure functions of ``dkb_listTasks`` answers, decoded as `consensus.task_info.TaskInfo`."""
from __future__ import annotations

from typing import Any

from consensus.task_info import SlotOutcome, TaskInfo, TaskStatus

ENDED = (TaskStatus.PAID, TaskStatus.STOPPED, TaskStatus.REJECTED)
MAX_ROWS = 50


def explorer_link(task_id: str) -> str:
    """The task's page in the explorer served by the same node (its audit slots, answers and verdicts)."""
    return f"/explorer/#task/{task_id}"


def history(tasks: list[TaskInfo], me: str) -> dict[str, list[dict[str, Any]]]:
    """The dashboard's history rows: earnings over time, audits, owned tasks."""
    return {"earnings": earnings_over_time(tasks, me), "audits": audits_of(tasks, me),
            "owned": owned_by(tasks, me)}


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
                            "evidence": explorer_link(task.task_id),
                            "reason": f"segment {slot.segment} did not replay to the committed hash "
                                      f"(evidence {(verdict.evidence if verdict else '') or 'none'})"})
            if slot.outcome not in SlotOutcome.PAID or verdict is None:
                continue
            answers = [(v.answer, "verifier") for v in slot.verifiers if v.verifier == me]
            answers += [(r.vote, "referee") for r in slot.referees if r.referee == me]
            for answer, kind in answers:
                if answer is not None and answer.key != verdict.key:
                    out.append({"task_id": task.task_id, "slot": slot.slot,
                                "evidence": explorer_link(task.task_id),
                                "reason": f"as {kind}: answered match={answer.match}, the verdict was "
                                          f"match={verdict.match}"})
    return out


def earnings_over_time(tasks: list[TaskInfo], me: str) -> list[dict[str, Any]]:
    """[{"task_id", "height", "amount", "total"}]: payouts to ``me`` in the order the tasks were assigned
    (oldest first), with the running total."""
    paid = [(task.assigned_height or task.created_height, task.task_id, int(task.payouts.get(me, 0)))
            for task in tasks if task.status in ENDED]
    out, total = [], 0
    for height, task_id, amount in sorted(p for p in paid if p[2]):
        total += amount
        out.append({"task_id": task_id, "height": height, "amount": amount, "total": total})
    return out[-MAX_ROWS:]


def audits_of(tasks: list[TaskInfo], me: str) -> list[dict[str, Any]]:
    """[{"task_id", "slot", "role", "outcome"}]: audit slots on ``me``'s segments (role "audited") and those
    ``me`` answered or was drawn for as verifier or referee; outcome "pending" until decided."""
    out = []
    for task in tasks:
        for slot in task.slots:
            roles = (["audited"] if slot.worker == me else []) + \
                (["verifier"] if any(v.verifier == me for v in slot.verifiers) else []) + \
                (["referee"] if any(r.referee == me for r in slot.referees) else [])
            for role in roles:
                out.append({"task_id": task.task_id, "slot": slot.slot, "role": role,
                            "outcome": slot.outcome or SlotOutcome.PENDING, "evidence": explorer_link(task.task_id)})
    return out[:MAX_ROWS]


def owned_by(tasks: list[TaskInfo], me: str) -> list[dict[str, Any]]:
    """[{"task_id", "status", "workers", "fetch"}]: tasks ``me`` submitted, with the command that downloads
    the trained weights once the task is paid."""
    out = []
    for task in tasks:
        if task.owner != me:
            continue
        key = task.task_id
        out.append({"task_id": key, "status": task.status, "workers": len(task.workers),
                    "fetch": f"dekube-node task fetch {key} --out weights-{key[:8]}"
                    if task.status in (TaskStatus.PAID, TaskStatus.STOPPED)
                    else ""})
    return out[:MAX_ROWS]

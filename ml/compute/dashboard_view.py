"""The compute role's part of the provider dashboard (node/dashboard, docs/adr/0195): from the ledger's
task records, what this node was paid per task (and in total over time), where it was slashed and why (with the
explorer's page of the task as the evidence), the audits it took part in, and the tasks it owns
(docs/adr/0198). Pure functions of ``dkb_listTasks`` answers."""
from __future__ import annotations

ENDED = ("paid", "rejected")
MAX_ROWS = 50


def explorer_link(task_id: str) -> str:
    """The task's page in the explorer served by the same node (its audit slots, answers and verdicts)."""
    return f"/explorer/#task/{task_id}"


def history(tasks: list[dict], me: str) -> dict:
    """The dashboard's history rows: earnings over time, audits, owned tasks."""
    return {"earnings": earnings_over_time(tasks, me), "audits": audits_of(tasks, me),
            "owned": owned_by(tasks, me)}


def payouts_to(tasks: list[dict], me: str) -> list[dict]:
    """[{"task_id", "status", "amount"}] for the ended tasks that paid ``me`` something."""
    out = []
    for task in tasks:
        amount = int((task.get("payouts") or {}).get(me, 0))
        if task.get("status") in ENDED and amount:
            out.append({"task_id": task["task_id"], "status": task["status"], "amount": amount})
    return out


def slashes_of(tasks: list[dict], me: str) -> list[dict]:
    """[{"task_id", "slot", "reason"}]: audit slots decided against ``me``, as a worker whose segment did not
    replay to its committed hash, or as a verifier or referee whose answer the verdict contradicts."""
    out = []
    for task in tasks:
        for slot in task.get("slots") or []:
            verdict = slot.get("verdict") or {}
            decided = (verdict.get("match"), verdict.get("evidence"))
            if slot.get("worker") == me and slot.get("outcome") == "guilty":
                out.append({"task_id": task["task_id"], "slot": slot.get("slot"),
                            "evidence": explorer_link(task["task_id"]),
                            "reason": f"segment {slot.get('segment')} did not replay to the committed hash "
                                      f"(evidence {verdict.get('evidence') or 'none'})"})
            if slot.get("outcome") not in ("ok", "guilty") or not verdict:
                continue
            answers = [(v.get("answer"), "verifier") for v in slot.get("verifiers") or [] if v.get("verifier") == me]
            answers += [(r.get("vote"), "referee") for r in slot.get("referees") or [] if r.get("referee") == me]
            for answer, kind in answers:
                if answer and (answer.get("match"), answer.get("evidence")) != decided:
                    out.append({"task_id": task["task_id"], "slot": slot.get("slot"),
                                "evidence": explorer_link(task["task_id"]),
                                "reason": f"as {kind}: answered match={answer.get('match')}, the verdict was "
                                          f"match={verdict.get('match')}"})
    return out


def earnings_over_time(tasks: list[dict], me: str) -> list[dict]:
    """[{"task_id", "height", "amount", "total"}]: payouts to ``me`` in the order the tasks were assigned
    (oldest first), with the running total."""
    paid = [(int(task.get("assigned_height") or task.get("created_height") or 0), task["task_id"],
             int((task.get("payouts") or {}).get(me, 0))) for task in tasks if task.get("status") in ENDED]
    out, total = [], 0
    for height, task_id, amount in sorted(p for p in paid if p[2]):
        total += amount
        out.append({"task_id": task_id, "height": height, "amount": amount, "total": total})
    return out[-MAX_ROWS:]


def audits_of(tasks: list[dict], me: str) -> list[dict]:
    """[{"task_id", "slot", "role", "outcome"}]: audit slots on ``me``'s segments (role "audited") and those
    ``me`` answered or was drawn for as verifier or referee; outcome "pending" until decided."""
    out = []
    for task in tasks:
        for slot in task.get("slots") or []:
            roles = (["audited"] if slot.get("worker") == me else []) + \
                (["verifier"] if any(v.get("verifier") == me for v in slot.get("verifiers") or []) else []) + \
                (["referee"] if any(r.get("referee") == me for r in slot.get("referees") or []) else [])
            for role in roles:
                out.append({"task_id": task["task_id"], "slot": slot.get("slot"), "role": role,
                            "outcome": slot.get("outcome") or "pending", "evidence": explorer_link(task["task_id"])})
    return out[:MAX_ROWS]


def owned_by(tasks: list[dict], me: str) -> list[dict]:
    """[{"task_id", "status", "workers", "fetch"}]: tasks ``me`` submitted, with the command that downloads
    the trained weights once the task is paid."""
    out = []
    for task in tasks:
        if task.get("owner") != me:
            continue
        key = task["task_id"]
        out.append({"task_id": key, "status": task.get("status"), "workers": len(task.get("workers") or []),
                    "fetch": f"dekube-node task fetch {key} --out weights-{key[:8]}" if task.get("status") == "paid"
                    else ""})
    return out[:MAX_ROWS]

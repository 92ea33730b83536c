"""The compute role's part of the provider dashboard (node/dashboard, docs/adr/0195): from the ledger's
task records, what this node was paid per task and where it was slashed and why. Pure functions of
``dkb_listTasks`` answers."""
from __future__ import annotations

ENDED = ("paid", "rejected")


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
                            "reason": f"segment {slot.get('segment')} did not replay to the committed hash "
                                      f"(evidence {verdict.get('evidence') or 'none'})"})
            if slot.get("outcome") not in ("ok", "guilty") or not verdict:
                continue
            answers = [(v.get("answer"), "verifier") for v in slot.get("verifiers") or [] if v.get("verifier") == me]
            answers += [(r.get("vote"), "referee") for r in slot.get("referees") or [] if r.get("referee") == me]
            for answer, kind in answers:
                if answer and (answer.get("match"), answer.get("evidence")) != decided:
                    out.append({"task_id": task["task_id"], "slot": slot.get("slot"),
                                "reason": f"as {kind}: answered match={answer.get('match')}, the verdict was "
                                          f"match={verdict.get('match')}"})
    return out

"""How a task is told: its audit slots (docs/adr/0168: each committed worker's drawn segments, the
verifiers' answers, a dispute, the referees' votes, the outcome) and the payouts of a paid task, each
labelled worker, verifier, referee, relay or refund (cli/payout_lines.py); the
reason, the workers' rejections and the refund of a rejected, expired or cancelled one.
``report_final`` returns the command's exit status (0 paid or cancelled by the owner, 1 rejected or
expired)."""
from __future__ import annotations

import json

from cli.payout_lines import payout_lines
from cli.safe_text import echo

FAILED = ("rejected", "expired")


def short(peer: str) -> str:
    return f"{peer[:16]}.." if len(peer) > 18 else peer


def answer_text(answer: dict | None) -> str:
    """A verifier's answer or a referee's vote: match / MISMATCH (at step s) and its evidence."""
    if answer is None:
        return "no answer yet"
    text = "match" if answer.get("match") else "MISMATCH"
    if not answer.get("match") and answer.get("step"):
        text += f" from step {answer['step']}"
    return f"{text}, evidence {str(answer.get('evidence', ''))[:16]}.."


def slot_lines(task: dict) -> list[str]:
    """One line per audit slot (worker, segment, outcome), then one per verifier, the dispute and
    one per referee."""
    slots = task.get("slots") or []
    if not slots:
        return []
    lines = [f"audit slots ({len(slots)}, profile {task.get('profile') or 'any'}):"]
    for slot in slots:
        lines.append(f"  slot {slot['slot']}  {slot['outcome']:9}  segment {slot['segment']} "
                     f"of {short(slot['worker'])}")
        for v in slot.get("verifiers") or []:
            answer = v.get("answer")
            text = "silent (no answer by its deadline)" if answer is None and slot["outcome"] != "pending" \
                else answer_text(answer)
            lines.append(f"      verifier {short(v['verifier'])}  {text}"
                         f"{'  [redrawn]' if v.get('redraw') else ''}  (due by height {v.get('deadline')})")
        if slot.get("dispute"):
            lines.append(f"      disputed by the worker at height {slot['dispute'].get('height')}")
        elif slot.get("dispute_deadline") and slot["outcome"] == "pending":
            lines.append(f"      the worker may dispute until height {slot['dispute_deadline']}")
        for r in slot.get("referees") or []:
            vote = r.get("vote")
            lines.append(f"      referee  {short(r['referee'])}  "
                         f"{answer_text(vote) if vote is not None else 'no vote'}"
                         f"  (due by height {slot.get('referee_deadline')})")
    return lines


def report_final(task: dict, *, as_json: bool = False, extra: dict | None = None) -> int:
    status = task["status"]
    code = 1 if status in FAILED else 0
    if as_json:
        print(json.dumps({**task, **(extra or {})}))
        return code
    if status in FAILED or status == "cancelled":
        echo(f"task {task['task_id']} {status}" + (f": {task['reason']}" if task.get("reason") else ""))
        for worker, reason in (task.get("rejections") or {}).items():
            echo(f"  rejected by worker {worker}: {reason}")
    for line in slot_lines(task):
        echo(line)
    payouts = task.get("payouts") or {}
    if payouts:
        echo(f"payouts of task {task['task_id']} (price {task['price']}):")
    for line in payout_lines(task):
        echo(line)
    if status == "paid":
        for worker in task["workers"]:
            if worker not in payouts:
                echo(f"  {worker}  {'worker':10} 0 (not paid: no commitment, or an audit slot found it guilty)")
    if task.get("result"):
        echo(f"result (weights artifact): {task['result']}")
    return code

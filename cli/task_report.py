"""How a finished task is told: audits and payouts of a paid task; the reason, the workers'
rejections and the refund of a rejected, expired or cancelled one. ``report_final`` returns the
command's exit status (0 paid or cancelled by the owner, 1 rejected or expired)."""
from __future__ import annotations

import json

FAILED = ("rejected", "expired")


def role_of(task: dict, peer: str) -> str:
    if peer == task["owner"]:
        return "owner"
    if peer in task["workers"]:
        return "worker"
    if any(audit[0] == peer for audit in task.get("audits") or []):
        return "verifier"
    return "relay"


def report_final(task: dict, *, as_json: bool = False, extra: dict | None = None) -> int:
    status = task["status"]
    code = 1 if status in FAILED else 0
    if as_json:
        print(json.dumps({**task, **(extra or {})}))
        return code
    if status in FAILED or status == "cancelled":
        print(f"task {task['task_id']} {status}" + (f": {task['reason']}" if task.get("reason") else ""))
        for worker, reason in (task.get("rejections") or {}).items():
            print(f"  rejected by worker {worker}: {reason}")
    for verifier, worker, segment, match, height in task.get("audits") or []:
        print(f"  audit by {verifier[:16]}.. of {worker[:16]}..: segment {segment} "
              f"{'match' if match else 'MISMATCH'} (height {height})")
    payouts = task.get("payouts") or {}
    if payouts:
        print(f"payouts of task {task['task_id']} (price {task['price']}):")
    for peer, amount in sorted(payouts.items(), key=lambda item: -item[1]):
        print(f"  {peer}  {role_of(task, peer):8} {amount}")
    if status == "paid":
        for worker in task["workers"]:
            if worker not in payouts:
                print(f"  {worker}  worker   0 (not paid: no commitment or audited as a mismatch)")
    if task.get("result"):
        print(f"result (weights artifact): {task['result']}")
    return code

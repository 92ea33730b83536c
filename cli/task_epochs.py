"""`task show` lines for a task cut into epochs (docs/adr/0203): how many epochs closed, the open one
and its deadline, and each worker's progress commitments (who left the crew after which epoch)."""
from __future__ import annotations

from cli.task_report import OPEN_FOR_COMMITS, deadline_text, short


def epoch_lines(task: dict) -> list[str]:
    """Nothing for a task without epochs; epochs are counted from 1 here (0 on the ledger)."""
    spec, progress = task.get("spec") or {}, task.get("epochs") or {}
    total = spec.get("epochs", 1)
    if not isinstance(total, int) or total <= 1 or not isinstance(progress, dict) or not progress:
        return []
    current = int(progress.get("current", 0))
    if "stopped" in progress:
        head = f"epochs:     stopped in epoch {int(progress['stopped']) + 1} of {total}; {current} closed"
    elif task.get("status") in OPEN_FOR_COMMITS:
        head = (f"epochs:     {current} of {total} closed; epoch {current + 1} open, commit by "
                f"{deadline_text(task, task.get('commit_deadline'))}")
    else:
        head = f"epochs:     {total} of {total} ended" if current == total - 1 else f"epochs:     {current} closed"
    lines = [head]
    commits = progress.get("commits") or {}
    for worker in task.get("workers") or []:
        mine = commits.get(worker) or []
        done = len(mine) + (1 if worker in (task.get("commits") or {}) and len(mine) == total - 1 else 0)
        left = " (left the crew)" if len(mine) < current and worker not in (task.get("rejections") or {}) else ""
        state = f", state {str(mine[-1][1])[:12]}" if mine else ""
        lines.append(f"  {short(worker)}  {min(done, total)} of {total} epochs committed{state}{left}")
    return lines

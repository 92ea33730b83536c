"""`task show` lines for a task cut into epochs (docs/adr/0203): how many epochs closed, the open one
and its deadline, the epochs paid out as audited (docs/adr/0230), and each worker's progress commitments and
pay so far (who left the crew after which epoch, who joined it at which, docs/adr/0226), and the seats of
a crew that may grow (docs/adr/0234)."""
from __future__ import annotations

from cli.task_report import OPEN_FOR_COMMITS, deadline_text, short
from consensus.task_info import TaskInfo


def epoch_lines(task: TaskInfo) -> list[str]:
    """Nothing for a task without epochs; epochs are counted from 1 here (0 on the ledger)."""
    progress, total = task.epochs, task.spec_field("epochs", 1)
    if not isinstance(total, int) or total <= 1 or progress is None:
        return []
    current = progress.current
    if progress.stopped is not None:
        head = f"epochs:     stopped in epoch {progress.stopped + 1} of {total}; {current} closed"
    elif task.status in OPEN_FOR_COMMITS:
        head = (f"epochs:     {current} of {total} closed; epoch {current + 1} open, commit by "
                f"{deadline_text(task, task.commit_deadline)}")
    else:
        head = f"epochs:     {total} of {total} ended" if current == total - 1 else f"epochs:     {current} closed"
    if progress.restarts:
        head += f" (crew restarted {progress.restarts}x after dying)"
    lines = [head]
    if task.max_seats > task.seats:   # a crew that may grow at epoch boundaries (docs/adr/0234)
        lines.append(f"seats:      {task.world_at(current)} open of up to {task.max_seats} "
                     f"({task.seats} asked; more join at epoch boundaries while free workers exist)")
    if progress.released:   # each epoch paid out once its audits resolved (docs/adr/0230)
        lines.append(f"paid out:   epochs 1-{len(progress.released)} of {total} (audited); "
                     f"{sum(progress.earned.values())} to workers, {task.escrow} still in escrow")
    for worker in task.workers:
        mine, first = progress.of(worker), progress.first_epoch(worker)
        reached = first + len(mine)   # a joiner's commitments start at its first epoch (docs/adr/0226)
        done = len(mine) + (1 if worker in task.commits and reached == total - 1 else 0)
        gone = reached < current or task.superseded(worker)   # missed a closed epoch, or a restart replaced it
        left = " (left the crew)" if gone and worker not in task.rejections else ""
        joined = f" (joined at epoch {first + 1}, seat {task.seat_of(worker) + 1})" if first else ""
        state = f", state {mine[-1].state_digest[:12]}" if mine else ""
        earned = f", earned {progress.earned[worker]}" if progress.earned.get(worker) else ""
        lines.append(f"  {short(worker)}  {min(done, total - first)} of {total - first} epochs committed{state}"
                     f"{earned}{joined}{left}")
    return lines

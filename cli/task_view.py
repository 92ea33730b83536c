"""What ``task submit --wait`` and ``task watch`` show: ledger status changes as lines, and the
workers' progress reports as one live rich progress bar (step, loss, eval metric, bytes sent, ETA).

On a terminal the bar redraws in place; otherwise (a log, a pipe, a test) each report of the
leading worker is one plain line, so the output stays readable. ``--json`` callers pass
``quiet=True`` and see nothing.
"""
from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from cli.safe_text import safe
from cli.task_report import deadline_text
from consensus.task_info import TaskInfo, TaskStatus
from ml.compute.job_board import JobState


def short(peer: str) -> str:
    return f"{peer[:12]}..{peer[-4:]}" if len(peer) > 20 else peer


def eval_text(metrics: dict | None) -> str:
    """The evaluation metrics of a report, e.g. ``accuracy 93.1``."""
    if not metrics:
        return ""
    return "  ".join(f"{name} {value:.4g}" if isinstance(value, (int, float)) else f"{name} {value}"
                     for name, value in sorted(metrics.items()))


def megabytes(count: int | float | None) -> str:
    return f"{(count or 0) / 1e6:.2f} MB"


class TaskView:
    """Status lines and a progress bar for one task."""

    def __init__(self, task_id: str, *, quiet: bool = False, console: Console | None = None) -> None:
        self.task_id = task_id
        self.quiet = quiet
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal and not quiet
        self.reports: dict[str, dict] = {}
        self.last_status: str | None = "?"   # nothing shown yet (None: not in a block yet)
        self._progress: Progress | None = None
        self._bar: TaskID | None = None
        self._last_line_step = -1
        self._joiners: set[str] = set()
        self._paid_epochs: set[int] = set()

    # ---- lines
    def note(self, text: str) -> None:
        if self.quiet:
            return
        stamp = time.strftime("%H:%M:%S")
        text = safe(text)   # reasons and names come from the chain and from peers
        if self._progress is not None:
            self._progress.console.print(f"  {stamp}  {text}", markup=False)
        else:
            self.console.print(f"  {stamp}  {text}", markup=False)

    def status(self, task: TaskInfo | None) -> None:
        """A line when the task's status changed (with the workers once assigned, the reason once ended),
        and for a task cut into epochs one when a worker joins the crew and one when an epoch is paid."""
        if task is not None and task.epochs is not None:
            self._epochs(task)
        status = None if task is None else task.status
        if status == self.last_status:
            return
        self.last_status = status
        if task is None:
            self.note("pending (not in a block yet)")
            return
        text = str(status)
        if status == TaskStatus.ASSIGNED:
            text += "  workers " + ", ".join(short(w) for w in task.workers)
            if task.commit_deadline:
                text += f"; commit due {deadline_text(task, task.commit_deadline)}"
        if task.reason:
            text += f": {task.reason}"
        self.note(text)
        for worker, reason in task.rejections.items():
            self.note(f"  rejected by {short(worker)}: {reason}")

    def _epochs(self, task: TaskInfo) -> None:
        progress = task.epochs
        assert progress is not None
        for worker, (seat, first) in progress.joined.items():
            if worker not in self._joiners:
                self._joiners.add(worker)
                self.note(f"worker {short(worker)} joined the crew at epoch {first} (seat {seat})")
        count = task.spec.get("epochs", 1)
        for epoch in progress.released:
            if epoch not in self._paid_epochs:
                self._paid_epochs.add(epoch)
                self.note(f"epoch {epoch + 1} of {count} audited and paid; the workers have earned "
                          f"{sum(progress.earned.values())} so far")

    # ---- progress
    def report(self, worker: str, report: dict) -> None:
        """A progress report (follow_progress) from ``worker``; shows the leading worker's numbers."""
        previous = self.reports.get(worker, {}).get("state")
        self.reports[worker] = report
        if self.quiet:
            return
        if report.get("state") in (JobState.REJECTED, JobState.FAILED) and previous != report.get("state"):
            why = report.get("reason") or report.get("error") or ""
            self.note(f"worker {short(worker)} {report['state']}" + (f": {why}" if why else ""))
        utilization = report.get("utilization")
        if report.get("state") == JobState.COMMITTED and previous != JobState.COMMITTED \
                and isinstance(utilization, (int, float)):
            self.note(f"worker {short(worker)} committed; it computed {utilization:.1%} of its training time")
        lead = max(self.reports.values(), key=lambda r: r.get("step") or 0)
        steps = lead.get("steps") or None
        step = lead.get("step") or 0
        loss = lead.get("loss")
        metric = safe(eval_text(self.latest_metrics()) or "-")
        if str(lead.get("state", "")).startswith("fetching") and lead.get("fetch_total"):
            metric = f"files {megabytes(lead.get('fetched_bytes'))} of {megabytes(lead['fetch_total'])}"
        fields: dict[str, Any] = {
            "loss": "-" if not isinstance(loss, (int, float)) else f"{loss:.4f}", "metric": metric,
            "sent": megabytes(sum(r.get("bytes_sent") or 0 for r in self.reports.values())),
            "state": safe(lead.get("state", ""))}
        if self.live:
            if self._progress is None:
                self._progress = Progress(
                    TextColumn("[bold]{task.fields[state]}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[metric]}"),
                    TextColumn("sent {task.fields[sent]}"), TextColumn("ETA"), TimeRemainingColumn(),
                    console=self.console, transient=False)
                self._progress.start()
                self._bar = self._progress.add_task("train", total=steps, **fields)
            assert self._bar is not None
            self._progress.update(self._bar, completed=step, total=steps, **fields)
        elif step != self._last_line_step:
            self._last_line_step = step
            of = f"/{steps}" if steps else ""
            eta = lead.get("eta_s")
            eta_text = f"  ETA {eta:.0f} s" if isinstance(eta, (int, float)) and step != steps else ""
            self.note(f"{fields['state']:10} step {step}{of}  loss {fields['loss']}  {fields['metric']}  "
                      f"sent {fields['sent']}{eta_text}  ({len(self.reports)} worker(s) reporting)")

    def latest_metrics(self) -> dict:
        with_metrics = [r for r in self.reports.values() if r.get("metrics")]
        if not with_metrics:
            return {}
        return max(with_metrics, key=lambda r: r.get("step") or 0)["metrics"]

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

"""The task view off a terminal: one line per status change (workers, reasons, rejections) and per
new step of the leading worker, with loss, eval metric and the bytes all workers sent."""
import io

from rich.console import Console

from cli.task_view import TaskView, eval_text
from consensus.task_info import TaskInfo


def view() -> tuple[TaskView, io.StringIO]:
    buffer = io.StringIO()
    return TaskView("ab" * 32, console=Console(file=buffer, width=200, force_terminal=False)), buffer


def test_status_lines_once_per_change_with_workers_and_reasons():
    shown, buffer = view()
    shown.status(None)
    shown.status(TaskInfo.from_json({"status": "created"}))
    shown.status(TaskInfo.from_json({"status": "created"}))
    shown.status(TaskInfo.from_json({"status": "assigned", "workers": ["12D3KooW" + "a" * 44, "12D3KooW" + "b" * 44]}))
    shown.status(TaskInfo.from_json({"status": "rejected", "reason": "2 of 3 workers rejected it",
                  "rejections": {"w1": "the model cannot run on the dataset's batches"}}))
    lines = buffer.getvalue().splitlines()
    assert [line.split("  ", 2)[2].split()[0].rstrip(":") for line in lines[:4]] == [
        "pending", "created", "assigned", "rejected"]
    assert "12D3KooWaaaa..aaaa" in lines[2]
    assert "rejected: 2 of 3 workers rejected it" in lines[3]
    assert "rejected by w1: the model cannot run" in lines[4]


def test_progress_lines_follow_the_leading_worker():
    shown, buffer = view()
    shown.report("w1", {"state": "fetching inputs", "step": 0, "steps": 40, "fetched_bytes": 5e5, "fetch_total": 1e6})
    shown.report("w1", {"state": "training", "step": 10, "steps": 40, "loss": 1.5, "bytes_sent": 1_000_000,
                        "eta_s": 12.4})
    shown.report("w2", {"state": "training", "step": 10, "steps": 40, "loss": 1.4, "bytes_sent": 2_000_000})
    shown.report("w2", {"state": "training", "step": 20, "steps": 40, "loss": 0.7, "bytes_sent": 3_000_000,
                        "metrics": {"accuracy": 81.25}})
    lines = buffer.getvalue().splitlines()
    assert "files 0.50 MB of 1.00 MB" in lines[0]
    assert len(lines) == 3   # w2's step 10 repeats the step shown
    assert "step 10/40  loss 1.5000" in lines[1] and "sent 1.00 MB  ETA 12 s" in lines[1]
    assert "step 20/40  loss 0.7000  accuracy 81.25  sent 4.00 MB" in lines[2]
    assert shown.latest_metrics() == {"accuracy": 81.25}


def test_quiet_view_prints_nothing():
    buffer = io.StringIO()
    shown = TaskView("ab" * 32, quiet=True, console=Console(file=buffer))
    shown.status(TaskInfo.from_json({"status": "created"}))
    shown.report("w", {"state": "training", "step": 3, "steps": 5, "loss": 1.0})
    assert buffer.getvalue() == ""
    assert eval_text({"loss": 0.5, "accuracy": 90}) == "accuracy 90  loss 0.5"


def test_a_worker_that_rejects_or_fails_is_said_once_with_its_reason():
    shown, buffer = view()
    shown.report("w1", {"state": "rejected", "step": 0, "steps": 5, "reason": "the loss is NaN after one step"})
    shown.report("w1", {"state": "rejected", "step": 0, "steps": 5, "reason": "the loss is NaN after one step"})
    shown.report("w2", {"state": "failed", "step": 3, "steps": 5, "error": "RuntimeError: boom"})
    text = buffer.getvalue()
    assert text.count("worker w1 rejected: the loss is NaN after one step") == 1
    assert "worker w2 failed: RuntimeError: boom" in text


def test_a_committed_worker_says_once_how_busy_its_hardware_was():
    shown, buffer = view()
    shown.report("w1", {"state": "training", "step": 40, "steps": 40, "utilization": 0.9})
    shown.report("w1", {"state": "committed", "step": 40, "steps": 40, "utilization": 0.9512})
    shown.report("w1", {"state": "committed", "step": 40, "steps": 40, "utilization": 0.9512})
    shown.report("w2", {"state": "committed", "step": 40, "steps": 40})   # an older worker: no figure
    said = [line for line in buffer.getvalue().splitlines() if "computed" in line]
    assert len(said) == 1 and "worker w1 committed; it computed 95.1% of its training time" in said[0]


def test_a_long_task_says_each_joiner_and_each_paid_epoch_once():
    shown, buffer = view()
    doc = {"status": "running", "segments": 4, "spec": {"epochs": 4},
           "epochs": {"current": 2, "released": [0], "earned": {"a": 100, "b": 100}}}
    shown.status(TaskInfo.from_json(doc))
    shown.status(TaskInfo.from_json(doc))
    doc["epochs"] = {"current": 3, "released": [0, 1], "earned": {"a": 200, "b": 150, "c": 50},
                     "joined": {"c": [1, 1]}}
    shown.status(TaskInfo.from_json(doc))
    lines = buffer.getvalue().splitlines()
    assert sum("epoch 1 of 4 audited and paid; the workers have earned 200 so far" in line for line in lines) == 1
    assert sum("epoch 2 of 4 audited and paid; the workers have earned 400 so far" in line for line in lines) == 1
    assert sum("worker c joined the crew at epoch 1 (seat 1)" in line for line in lines) == 1

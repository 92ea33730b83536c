"""The bounded per-step history the compute role serves through dkb_taskProgress (the explorer's
training curves): every report kept while it fits, then halved resolution, eval metrics kept, odd
values dropped, the final summary not doubled."""
import math

from ml.compute.progress_history import record_point


def test_history_keeps_points_then_halves_resolution():
    job: dict = {}
    for step in range(1, 101):
        record_point(job, step, 10.0 / step, None, limit=16)
    history = job["history"]
    assert len(history) <= 16
    steps = [p["step"] for p in history]
    assert steps[0] == 1 and steps == sorted(steps)
    assert steps[-1] >= 100 - job["history_stride"]   # recent steps still there
    assert all(p["loss"] == 10.0 / p["step"] for p in history)


def test_eval_metrics_kept_and_bad_values_dropped():
    job: dict = {"history_stride": 8}
    record_point(job, 3, 1.0, {"accuracy": 90.5, "bad": math.nan, "x": "text"})
    record_point(job, 5, math.inf, None)          # off-stride and no metrics: skipped
    record_point(job, 8, math.nan, None)
    assert job["history"] == [{"step": 3, "loss": 1.0, "metrics": {"accuracy": 90.5}},
                              {"step": 8, "loss": None}]
    record_point(job, 8, 0.5, {"accuracy": 91.0})   # the final summary repeats a step: replaced
    assert job["history"][-1] == {"step": 8, "loss": 0.5, "metrics": {"accuracy": 91.0}}
    assert len(job["history"]) == 2

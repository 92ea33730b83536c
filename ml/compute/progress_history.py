"""A bounded per-step history of a training job (loss and eval metrics per step), kept in the
job record the compute role serves through ``dkb_taskProgress`` so a page can draw the curve.

At most ``limit`` points: when full, every other point is dropped (the first and the newest kept)
and from then on only every ``stride``-th step is recorded, so a long run keeps its whole shape
in bounded memory and response size.
"""
from __future__ import annotations

import math

HISTORY_LIMIT = 256


def _finite(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def record_point(job: dict, step: int, loss: float | None, metrics: dict | None, limit: int = HISTORY_LIMIT) -> None:
    """Append {"step", "loss", "metrics"?} to ``job["history"]``; a report with eval metrics is
    always kept (they are rare), a plain loss report only on the current stride."""
    history: list[dict] = job.setdefault("history", [])
    stride: int = job.get("history_stride", 1)
    finite = {str(name)[:64]: _finite(value) for name, value in (metrics or {}).items()}
    evals = {name: value for name, value in finite.items() if value is not None}
    if history and history[-1]["step"] == step:
        history.pop()   # the final summary repeats the last step
    elif not evals and step % stride:
        return
    point: dict = {"step": int(step), "loss": _finite(loss)}
    if evals:
        point["metrics"] = dict(list(evals.items())[:8])
    history.append(point)
    if len(history) > limit:
        history[:] = history[:1] + history[2::2]
        job["history_stride"] = stride * 2

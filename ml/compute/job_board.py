"""The compute node's task shares and their progress, with change notifications for watchers.

`JobBoard.jobs` is the dict `/status` and `dkb_taskProgress` show (task id hex -> job fields);
every change goes through `update`, which wakes the `watch` iterators that the progress protocol
serves (docs/adr/0157). A job's bounded per-step history (loss and eval metrics) is its "history"
field, kept by `ml.compute.progress_history.record_point`; watchers get it once, on their first
snapshot.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any


class JobState:
    """Where this node's share of a task stands (the job board's ``state``; not the ledger's TaskStatus)."""
    REJECTING = "rejecting"
    COMMITTED = "committed"
    FAILED = "failed"
    REJECTED = "rejected"
    MIRRORING = "mirroring"   # not our share: a verifier's copy of the task's epoch states (docs/adr/0236)
    MIRRORED = "mirrored"     # that copy, once the task ended


TERMINAL = (JobState.COMMITTED, JobState.FAILED, JobState.REJECTED, JobState.MIRRORED)
MIN_INTERVAL_S = 0.25     # watchers get at most ~4 snapshots a second (changes in between coalesce)
KEEPALIVE_S = 15.0        # and one at least this often, changed or not
SNAPSHOT_FIELDS = ("state", "step", "steps", "loss", "metrics", "bytes_sent", "eta_s", "error", "reason",
                   "fetched_bytes", "fetch_total", "result", "epoch_states", "utilization")


class JobBoard:
    def __init__(self, clock=time.time) -> None:
        self.jobs: dict[str, dict] = {}
        self._clock = clock
        self._versions: dict[str, int] = {}
        self._changed: dict[str, asyncio.Event] = {}

    def start(self, key: str, **fields: Any) -> dict:
        """A new job for `key` (replacing any earlier one of the same task)."""
        self.jobs[key] = {"state": "starting", "step": 0, "steps": 0, "loss": None, "bytes_sent": 0,
                          "started_at": self._clock(), **fields}
        self._touch(key)
        return self.jobs[key]

    def update(self, key: str, **fields: Any) -> None:
        job, now = self.jobs[key], self._clock()
        if fields.get("state") == "training" and job.get("state") != "training":
            job["training_since"] = now
        left_training = job.get("state") == "training" and fields.get("state") not in (None, "training")
        job.update(fields)
        if left_training:
            job.setdefault("training_until", now)
        if left_training or "compute_s" in fields:
            job["utilization"] = utilization(job, now)
        self._touch(key)

    def end_training(self, key: str, compute_s: float) -> None:
        """The job trained its last step: its compute time, and its training span closed here (what follows,
        saving and committing the result, is not training)."""
        job = self.jobs[key]
        job["training_until"] = self._clock()
        self.update(key, compute_s=round(compute_s, 3))

    def history(self, key: str) -> list[dict]:
        job = self.jobs.get(key)
        return list(job.get("history", ())) if job is not None else []

    def _touch(self, key: str) -> None:
        self._versions[key] = self._versions.get(key, 0) + 1
        event = self._changed.pop(key, None)
        if event is not None:
            event.set()

    def snapshot(self, key: str) -> dict:
        """What a watcher sees of the job: SNAPSHOT_FIELDS present, plus an ETA while training."""
        job = self.jobs[key]
        out = {name: job[name] for name in SNAPSHOT_FIELDS if name in job}
        out.setdefault("metrics", {})
        out["metrics"] = out["metrics"] or {}
        out["eta_s"] = eta_seconds(job, self._clock())
        return out

    async def watch(self, key: str) -> AsyncIterator[dict]:
        """Snapshots of `key`'s job as it changes (coalesced), ending after a terminal state.
        The job must exist."""
        seen = -1
        while True:
            version = self._versions[key]
            if version != seen:
                seen = version
                snapshot = self.snapshot(key)
                yield snapshot
                if snapshot["state"] in TERMINAL:
                    return
                await asyncio.sleep(MIN_INTERVAL_S)
                continue
            event = self._changed.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), KEEPALIVE_S)
            if self._versions[key] == seen:   # nothing changed: a keepalive of the same snapshot
                seen = -1

    async def wait_for(self, key: str, timeout: float) -> bool:
        """True once a job for `key` exists (waiting at most `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while key not in self.jobs:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._changed.pop(key, None)   # asks about unknown tasks leave nothing behind
                return False
            event = self._changed.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
        return True


def utilization(job: dict, now: float) -> float | None:
    """The job's compute time over its training wall time (from entering ``training`` until it left it, or
    now): what share of the time it trained its seat kept the hardware busy, waits for the network and at
    epoch boundaries counted as idle. None before there is a span or a compute figure."""
    since, compute_s = job.get("training_since"), job.get("compute_s")
    if since is None or compute_s is None:
        return None
    span = job.get("training_until", now) - since
    return round(min(1.0, compute_s / span), 4) if span > 0 else None


def eta_seconds(job: dict, now: float) -> float | None:
    """Seconds left at the training rate so far, or None before there is one."""
    since, step, steps = job.get("training_since"), job.get("step") or 0, job.get("steps") or 0
    if job.get("state") != "training" or since is None or step <= 0 or steps <= step:
        return 0.0 if job.get("state") in TERMINAL else None
    return round((now - since) / step * (steps - step), 1)

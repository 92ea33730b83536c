"""A worker's progress commitments for a task cut into epochs (docs/adr/0203, consensus/state/epochs.py).

`epochs_for` is how `task submit` cuts a task: the most epochs that divide its segments with at least
EPOCH_TARGET_S of the declared work each (an epoch is a few minutes; a short task stays one epoch).
`EpochCommitter.alongside` runs beside a worker's training: as soon as its recorder holds the records
of an epoch (every epoch but the last, which the task's commit_result ends), it keeps them (so the
node serves them to verifiers, from disk after a restart too) and sends ``commit_epoch``: the Merkle
root of its segment records so far, their count and the digest of its state at the epoch end (the
last record's ``state_out``). Hashing runs off the event loop. `crew_exit` tells a worker that the
ledger takes no more commitments from it (the crew stopped, or it missed an epoch), so it stops training.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from consensus.task_info import TaskInfo
from ml.compute.segment_record import SegmentRecord, leaves, root
from ml.compute.task_spec import InvalidTask, declared_segments

EPOCH_TARGET_S = 180    # the least declared work an epoch is cut to (a few minutes)
POLL_S = 0.2            # how often the committer looks at the recorder while training runs


def epochs_for(expected_s: int | None, segments: int, target_s: int = EPOCH_TARGET_S, min_segments: int = 1) -> int:
    """The epoch count for a task of ``segments`` expected to take ``expected_s``: the largest divisor of
    ``segments`` that leaves each epoch at least ``target_s`` of work and ``min_segments`` segments (each
    epoch is audited on its own: fewer segments than the chain's audit budget needs cost a surcharge,
    docs/adr/0212, 0230); 1 when nothing is declared."""
    if not expected_s or segments < 2:
        return 1
    return max(e for e in range(1, segments + 1) if segments % e == 0
               and (e == 1 or (expected_s / e >= target_s and segments // e >= min_segments)))


def epoch_layout(task: TaskInfo) -> tuple[int, int]:
    """(epochs, segments per epoch) of a ledger task; InvalidTask for a layout the ledger would not have
    accepted."""
    epochs = task.spec_field("epochs", 1)
    segments = declared_segments(task)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise InvalidTask(f"the task declares an invalid epoch count {epochs!r}")
    if epochs > 1 and (segments is None or segments % epochs):
        raise InvalidTask(f"{epochs} epochs do not divide the task's {segments} segments")
    return epochs, (segments or 0) // epochs


@dataclass(frozen=True)
class Progress:
    """One epoch's progress commitment."""

    epoch: int
    segments_root: bytes
    state_digest: bytes
    segments: int

    def payload(self, task_id: bytes) -> dict:
        """The commit_epoch transaction payload."""
        return {"task_id": task_id, "epoch": self.epoch, "segments_root": self.segments_root,
                "state_digest": self.state_digest, "segments": self.segments}


def progress_at(task_id: bytes, worker: str, records: list[SegmentRecord], epoch: int) -> Progress:
    """The commitment to ``records`` (a worker's segments from its first, ending epoch ``epoch``)."""
    return Progress(epoch, root(leaves(task_id, worker, records)), bytes.fromhex(records[-1].state_out),
                    records[-1].index + 1)


class EpochCommitter:
    """Sends a worker's commit_epoch for each epoch but the last while it trains."""

    def __init__(self, task: TaskInfo, task_id: bytes, worker: str, recorder: Any,
                 send: Callable[[str, dict], Awaitable[Any]], keep: Callable[[dict], Awaitable[None]]):
        self.epochs, self.per_epoch = epoch_layout(task)
        self.first = task.first_epoch(worker)   # 0, or the epoch a joiner entered at (docs/adr/0226)
        self.task_id, self.worker, self.recorder = task_id, worker, recorder
        self.send, self.keep = send, keep
        self.committed: list[Progress] = []
        self.on_committed: Callable[[Progress], None] | None = None   # after each epoch's commit_epoch
        self.failed: BaseException | None = None   # what stopped the committing (a refused commitment)
        self._changed = asyncio.Event()

    async def wait_committed(self, epoch: int) -> None:
        """Until this worker's commitment of ``epoch`` is on the ledger; raises what stopped the committing
        (the ledger refused a commitment: the worker left the crew)."""
        while not any(progress.epoch == epoch for progress in self.committed):
            if self.failed is not None:
                raise RuntimeError(f"epoch {epoch} was not committed: {self.failed}")
            self._changed.clear()
            await self._changed.wait()

    async def alongside(self, training: Awaitable[dict]) -> dict:
        """Await ``training`` (its summary) while committing each epoch it completes; raises what the
        committing raised (a refused commitment: the worker left the crew) once training ended."""
        if self.epochs <= 1:
            return await training
        finished = asyncio.Event()
        committing = asyncio.ensure_future(self._commit_all(finished))
        committing.add_done_callback(self._note_end)
        try:
            summary = await training
        except BaseException:
            committing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await committing
            raise
        finished.set()
        await committing
        return summary

    async def _commit_all(self, finished: asyncio.Event) -> None:
        for epoch in range(self.first, self.epochs - 1):
            count = (epoch + 1 - self.first) * self.per_epoch
            while len(self.recorder.records) < count:
                if finished.is_set():
                    raise RuntimeError(f"training ended with {len(self.recorder.records)} segment records; "
                                       f"epoch {epoch} needs {count}")
                await asyncio.sleep(POLL_S)
            records = list(self.recorder.records[:count])
            progress = await asyncio.to_thread(progress_at, self.task_id, self.worker, records, epoch)
            await self.keep({"records": [r.to_obj() for r in records], "leaf_worker": self.worker,
                             "segments_root": progress.segments_root.hex(), "epoch": epoch})
            await self.send("commit_epoch", progress.payload(self.task_id))
            self.committed.append(progress)
            self._changed.set()
            if self.on_committed is not None:
                self.on_committed(progress)


    def _note_end(self, committing: asyncio.Future) -> None:
        if not committing.cancelled() and committing.exception() is not None:
            self.failed = committing.exception()
        elif self.failed is None:
            self.failed = RuntimeError("the committing ended")
        self._changed.set()


def crew_exit(task: TaskInfo, worker: str) -> str:
    """Why the ledger takes no more commitments from ``worker`` on a task still open for them: the crew
    stopped (the task ended at its last closed epoch), ``worker`` missed an epoch that closed, or its seat
    went to a new crew that restarted the epoch it had not committed (docs/adr/0232); "" when it is still
    in the crew (or the task has no epochs)."""
    progress = task.epochs
    if progress is None:
        return ""
    if progress.stopped is not None:
        return f"the crew stopped in epoch {progress.stopped + 1}: the task ended at its last closed epoch"
    reached = progress.first_epoch(worker) + len(progress.of(worker))
    if reached < progress.current:
        return f"this worker left the crew: epoch {reached + 1} closed without its commitment"
    if task.superseded(worker):
        return (f"this worker left the crew: epoch {reached + 1} passed its deadline without any commitment and "
                "restarted on a new crew")
    return ""

"""Run one worker's share of a task: an all-reduce group over the given transport, the trainer for the
task's spec, progress into a ProgressFeed, and a summary with the hashes to commit.

The trainer is built before the start barrier (`prepare_trainer`, in a thread) so that every
worker is ready to compute at once when the first round begins. Ranks are positions in the sorted worker list (the ledger keeps workers sorted), so every worker and
every verifier derives the same rank for the same peer. The group uses a protocol id per task, so a
node can serve two tasks' rounds without mixing them. Torch work runs in threads (the trainers use
`asyncio.to_thread`); only the all-reduce I/O is on the event loop.
"""
from __future__ import annotations

from ml.allreduce import AllReduceGroup, DeadlinePolicy
from ml.train.allreduce_averager import averager_for_group, group_codec
from ml.train.averaging import Averaged, Averager
from ml.train.progress import ProgressFeed
from ml.train.simulation import make_trainer
from ml.train.spec import TrainSpec
from ml.train.worker import TrainerBase

ALLREDUCE_PROTOCOL = "/dekube/allreduce/1"
# Wider first deadlines than the all-reduce default: a worker's first round can start seconds after
# its peers' on a loaded home machine, and a wrongly dropped peer would fail the whole task.
TASK_DEADLINES = DeadlinePolicy(floor_s=10.0, initial_s=15.0, first_frame_grace_s=15.0, ceiling_s=60.0)


class ParticipationLog:
    """An averager wrapper that records the rounds whose mean lacked some workers' contributions.

    The worker serves this record with its segment hashes, so a verifier replays the same departures
    (`ml.compute.replay.departures`) and still gets the survivors' hashes bit for bit."""

    def __init__(self, inner: Averager, workers: int):
        self.inner = inner
        self.workers = workers
        self.short_rounds: list[tuple[int, list]] = []

    async def average(self, tensors, round_id: int) -> Averaged:
        result = await self.inner.average(tensors, round_id)
        if len(result.participants) != self.workers:
            self.short_rounds.append((round_id, list(result.participants)))
        return result

    def __getattr__(self, name):  # state_dict/load_state_dict of the wrapped averager, if any
        return getattr(self.inner, name)


def task_protocol(task_id: bytes) -> str:
    """The all-reduce protocol id for one task's group."""
    return f"{ALLREDUCE_PROTOCOL}/{task_id.hex()[:16]}"


def make_group(spec: TrainSpec, transport, me: str, workers: list[str], task_id: bytes,
               mode: str = "butterfly") -> AllReduceGroup:
    """The all-reduce group of `me` among `workers` for one task (not started)."""
    return AllReduceGroup(transport, me, sorted(workers), mode=mode, codec=group_codec(spec),
                          deadlines=TASK_DEADLINES, min_participants=min(2, len(workers)),
                          protocol=task_protocol(task_id))


def prepare_trainer(spec: TrainSpec, group: AllReduceGroup, me: str, workers: list[str],
                    feed: ProgressFeed | None = None) -> TrainerBase:
    """Build `me`'s trainer (loads the dataset, builds the model: seconds on a busy machine, so call it
    in a thread and before the start barrier, never between the barrier and the first round)."""
    ordered = sorted(workers)
    averager = ParticipationLog(averager_for_group(spec, group), len(ordered))
    return make_trainer(spec, ordered.index(me), len(ordered), averager, feed)


async def run_trainer(trainer: TrainerBase) -> dict:
    """Train to the end over the trainer's (started) group; returns what a commitment needs. The
    caller closes the group once its peers are done."""
    metrics = await trainer.run()
    return {"rank": trainer.rank, "metrics": metrics, "steps": trainer.step, "bytes_sent": trainer.bytes_sent,
            "params_hash": trainer.params_hash(), "segment_hashes": list(trainer.segment_hashes),
            "participants": list(trainer.last_participants), "short_rounds": trainer.averager.short_rounds}

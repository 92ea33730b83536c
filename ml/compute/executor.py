"""Run one worker's share of a task: an all-reduce group over the given transport, the trainer for the
task's spec, progress into a ProgressFeed, and a summary with the hashes to commit.

Ranks are positions in the sorted worker list (the ledger keeps workers sorted), so every worker and
every verifier derives the same rank for the same peer. The group uses a protocol id per task, so a
node can serve two tasks' rounds without mixing them. Torch work runs in threads (the trainers use
`asyncio.to_thread`); only the all-reduce I/O is on the event loop.
"""
from __future__ import annotations

from ml.allreduce import AllReduceGroup, DeadlinePolicy
from ml.job.runner import train_over_group
from ml.train.allreduce_averager import group_codec
from ml.train.progress import ProgressFeed
from ml.train.spec import TrainSpec

ALLREDUCE_PROTOCOL = "/dekube/allreduce/1"


def task_protocol(task_id: bytes) -> str:
    """The all-reduce protocol id for one task's group."""
    return f"{ALLREDUCE_PROTOCOL}/{task_id.hex()[:16]}"


def make_group(spec: TrainSpec, transport, me: str, workers: list[str], task_id: bytes,
               mode: str = "butterfly") -> AllReduceGroup:
    """The all-reduce group of `me` among `workers` for one task (not started)."""
    return AllReduceGroup(transport, me, sorted(workers), mode=mode, codec=group_codec(spec),
                          deadlines=DeadlinePolicy(), min_participants=min(2, len(workers)),
                          protocol=task_protocol(task_id))


async def train_task(spec: TrainSpec, group: AllReduceGroup, me: str, workers: list[str],
                     feed: ProgressFeed | None = None) -> dict:
    """Train `me`'s share over a started `group`; returns the ml.job summary (segment_hashes,
    params_hash, bytes_sent, metrics, ...). The caller closes the group once its peers are done."""
    ordered = sorted(workers)
    return await train_over_group(spec, ordered.index(me), len(ordered), group, feed)

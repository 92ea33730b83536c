"""Set up one worker's share of a task: an all-reduce group over the given transport and the trainer for
the task's spec (its averager records short rounds), reporting into a ProgressFeed; the training
itself and its summary are `ml.job.runner.train_to_end`.

The trainer is built before the start barrier (`prepare_trainer`, in a thread) so that every
worker is ready to compute at once when the first round begins. Ranks are positions in the sorted
worker list (the ledger keeps workers sorted), so every worker and every verifier derives the same
rank for the same peer. The group uses a protocol id per task, so a
node can serve two tasks' rounds without mixing them, and signs what it sends with the node's key
(docs/adr/0209). Torch work runs in threads (the trainers use
`asyncio.to_thread`); only the all-reduce I/O is on the event loop.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ml.allreduce import AllReduceGroup, DeadlinePolicy
from ml.allreduce.receipts import WireSigner
from ml.job.participation import ParticipationLog
from ml.train.allreduce_averager import averager_for_group, group_codec
from ml.train.faults import MODES as TRAINER_FAULTS
from ml.train.faults import install as install_fault
from ml.train.faults import wire_group
from ml.train.progress import ProgressFeed
from ml.train.segments import BlobSink, SegmentRecorder
from ml.train.simulation import make_trainer
from ml.train.spec import TrainSpec
from ml.train.worker import TrainerBase
from node.identity import Identity, verify_by_peer_id

ALLREDUCE_PROTOCOL = "/dekube/allreduce/1"
# Wider first deadlines than the all-reduce default: a worker's first round can start seconds after
# its peers' on a loaded home machine, and a wrongly dropped peer would fail the whole task.
TASK_DEADLINES = DeadlinePolicy(floor_s=10.0, initial_s=15.0, first_frame_grace_s=15.0, ceiling_s=60.0)


def task_protocol(task_id: bytes) -> str:
    """The all-reduce protocol id for one task's group."""
    return f"{ALLREDUCE_PROTOCOL}/{task_id.hex()[:16]}"


def make_group(spec: TrainSpec, transport, me: str, workers: list[str], task_id: bytes,
               mode: str = "butterfly", identity: Identity | None = None) -> AllReduceGroup:
    """The all-reduce group of `me` among `workers` for one task (not started); with `me`'s `identity`,
    it signs what it sends and takes only signed bytes (docs/adr/0209: the receipts judges count)."""
    return AllReduceGroup(transport, me, sorted(workers), mode=mode, codec=group_codec(spec),
                          deadlines=TASK_DEADLINES, min_participants=min(2, len(workers)),
                          protocol=task_protocol(task_id),
                          signer=None if identity is None else task_signer(identity, task_id))


def task_signer(identity: Identity, task_id: bytes) -> WireSigner:
    """`identity`'s signer of what it sends in task `task_id`'s rounds, checking its peers' by peer ID."""
    return WireSigner(identity.peer_id, task_id, identity.sign, verify_by_peer_id)


def prepare_trainer(spec: TrainSpec, group: AllReduceGroup, rank: int, world: int,
                    feed: ProgressFeed | None = None, files: Mapping[str, Path] | None = None,
                    sink: BlobSink | None = None, fault: str = "") -> TrainerBase:
    """Build the trainer of seat `rank` of `world` (a worker's place among the task's sorted first workers,
    or the seat a joiner took: consensus/state/crew.py) (loads the dataset, builds the model: seconds on a
    busy machine, so call it in a thread and before the start barrier, never between the barrier and the
    first round).
    `files` maps the artifact ids the spec names (ml.train.inputs.artifact_ids) to local paths. With
    a `sink`, the trainer keeps per-segment records (`trainer.recorder.records`) and puts their
    checkpoints and averages into it; `fault` is a testing-only adversary mode (ml.train.faults)."""
    averager = ParticipationLog(averager_for_group(spec, wire_group(group, fault)), world)
    trainer = make_trainer(spec, rank, world, averager, feed, files)
    if sink is not None:
        SegmentRecorder(sink).attach(trainer)
    if fault in TRAINER_FAULTS or fault.startswith("partial:"):
        install_fault(trainer, fault)
    return trainer


def grow_crew(trainer: TrainerBase, world: int, from_step: int) -> None:
    """The crew grew to ``world`` seats at the epoch starting at ``from_step`` (docs/adr/0234): the data
    is cut into that many shards from there, and rounds of that many workers are full rounds."""
    trainer.reshard(world, from_step)
    if isinstance(trainer.averager, ParticipationLog):
        trainer.averager.workers = world

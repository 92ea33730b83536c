"""One worker's share of a training job over an all-reduce group: build the trainer for the spec,
train to the end, and summarize what a verifier and the ledger need (hashes, bytes, metrics, and
the rounds that lacked someone, from which a replay reproduces a run where a worker left).
"""
from __future__ import annotations

from ml.job.participation import ParticipationLog
from ml.train.allreduce_averager import averager_for_group
from ml.train.progress import ProgressFeed
from ml.train.simulation import make_trainer
from ml.train.spec import TrainSpec
from ml.train.worker import TrainerBase


async def train_over_group(spec: TrainSpec, rank: int, world: int, group,
                           feed: ProgressFeed | None = None) -> dict:
    """Train worker `rank` of `world` over `group` (an AllReduceGroup built with
    codec=ml.train.allreduce_averager.group_codec(spec)); returns the worker's summary."""
    averager = ParticipationLog(averager_for_group(spec, group), world)
    return await train_to_end(make_trainer(spec, rank, world, averager, feed))


async def train_to_end(trainer: TrainerBase) -> dict:
    """Run `trainer` (whose averager is a ParticipationLog over a started group) to the end; returns
    its summary. The caller closes the group once its peers are done."""
    log = trainer.averager
    if not isinstance(log, ParticipationLog):
        raise TypeError(f"the trainer's averager is a {type(log).__name__}, not the ParticipationLog a job records")
    metrics = await trainer.run()
    return {"rank": trainer.rank, "metrics": metrics, "steps": trainer.step, "bytes_sent": trainer.bytes_sent,
            "params_hash": trainer.params_hash(), "segment_hashes": list(trainer.segment_hashes),
            "participants": list(trainer.last_participants),
            "short_rounds": [[round_id, list(peers)] for round_id, peers in log.short_rounds]}

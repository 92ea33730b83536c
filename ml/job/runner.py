"""One worker's share of a training job over an all-reduce group: build the trainer for the spec,
train to the end, and summarize what a verifier and the ledger need (hashes, bytes, metrics).
"""
from __future__ import annotations

from ml.train.allreduce_averager import averager_for_group
from ml.train.progress import ProgressFeed
from ml.train.simulation import make_trainer
from ml.train.spec import TrainSpec


async def train_over_group(spec: TrainSpec, rank: int, world: int, group,
                           feed: ProgressFeed | None = None) -> dict:
    """Train worker `rank` of `world` over `group` (an AllReduceGroup built with
    codec=ml.train.allreduce_averager.group_codec(spec)); returns the worker's summary."""
    trainer = make_trainer(spec, rank, world, averager_for_group(spec, group), feed)
    metrics = await trainer.run()
    return {
        "rank": rank,
        "metrics": metrics,
        "steps": trainer.step,
        "bytes_sent": trainer.bytes_sent,
        "params_hash": trainer.params_hash(),
        "segment_hashes": trainer.segment_hashes,
        "participants": list(trainer.last_participants),
    }

"""Replay of a task's training by a verifier: every worker of the job simulated in this process, over
the same all-reduce code on loopback TCP, up to the last segment being audited.

CPU training is bit-reproducible and the all-reduce result does not depend on timing or transport
(the same plan, codec and summation order), so the replayed segment hashes equal the honest
workers' ones bit for bit (tested against a networked run). Replaying segment k costs the job's
first k+1 segments for all workers together; it runs on its own event loop in a worker thread so the
node's loop stays responsive.
"""
from __future__ import annotations

import asyncio

from ml.allreduce import TcpTransport
from ml.compute.executor import make_group
from ml.train.allreduce_averager import averager_for_group
from ml.train.simulation import make_trainer
from ml.train.spec import TrainSpec


def segments_needed(spec: TrainSpec, last_segment: int) -> dict:
    """How far to train so that segment `last_segment` (0-based) exists: the trainer's run() kwargs."""
    if spec.mode == "diloco":
        return {"until_outer_step": min(last_segment + 1, spec.outer_steps)}
    return {"until_step": min((last_segment + 1) * spec.segment_steps, spec.steps)}


async def replay_job(spec: TrainSpec, workers: list[str], last_segment: int, task_id: bytes = bytes(32),
                     mode: str = "butterfly") -> dict[str, list[str]]:
    """Segment hashes 0..last_segment of every worker (peer id -> hex hashes) by replaying the job."""
    ordered = sorted(workers)
    transports = [TcpTransport(peer) for peer in ordered]
    groups = []
    try:
        addresses = {peer: await t.start() for peer, t in zip(ordered, transports)}
        for transport in transports:
            transport.addresses.update(addresses)
        groups = [make_group(spec, t, peer, ordered, task_id, mode) for peer, t in zip(ordered, transports)]
        for group in groups:
            await group.start()
        trainers = [make_trainer(spec, rank, len(ordered), averager_for_group(spec, group))
                    for rank, group in enumerate(groups)]
        until = segments_needed(spec, last_segment)
        await asyncio.gather(*(trainer.run(**until) for trainer in trainers))
        return {peer: list(trainer.segment_hashes[:last_segment + 1]) for peer, trainer in zip(ordered, trainers)}
    finally:
        for group in groups:
            await group.close()
        for transport in transports:
            await transport.close()


def replay_job_blocking(spec: TrainSpec, workers: list[str], last_segment: int, task_id: bytes = bytes(32),
                        mode: str = "butterfly") -> dict[str, list[str]]:
    """`replay_job` on a fresh event loop (call it from a worker thread)."""
    return asyncio.run(replay_job(spec, workers, last_segment, task_id, mode))

"""A whole training job replayed in one process -- every worker simulated over the same all-reduce code
on loopback TCP, up to a given segment -- as the tests' reference for what networked runs must
produce bit for bit (verifiers no longer do this: they replay one worker's segment from its committed
state, ml/compute/segment_replay.py).

Workers that left the real run (a crash, or a round whose result they could not get: the trainer stops
then; one left out of a round that took the others' result stayed, docs/adr/0242) are made to leave the
replay at the same round (`ml.job.participation.departures` of the rounds the workers
reported as short): their group and transport close, the others' attempt fails at once and is redone
among the rest, exactly as in the real run, so the survivors' hashes still match.
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from ml.allreduce import TcpTransport
from ml.compute.executor import make_group
from ml.train.allreduce_averager import averager_for_group
from ml.train.simulation import make_trainer
from ml.train.spec import TrainSpec


class WorkerLeft(RuntimeError):
    """Raised in a replayed worker at the round where the real worker left the job."""


class LeavingAverager:
    """Replay stand-in for a worker that left at `leave_round`: averages normally before it, then
    closes its group and transport (its peers see the link fail) and raises WorkerLeft."""

    def __init__(self, inner, group, transport, leave_round: int):
        self.inner, self.group, self.transport, self.leave_round = inner, group, transport, leave_round

    async def average(self, tensors, round_id: int):
        if round_id >= self.leave_round:
            await self.group.close()
            await self.transport.close()
            raise WorkerLeft(f"left at round {self.leave_round}")
        return await self.inner.average(tensors, round_id)


def segments_needed(spec: TrainSpec, last_segment: int) -> dict:
    """How far to train so that segment `last_segment` (0-based) exists: the trainer's run() kwargs."""
    if spec.outer_mode:
        return {"until_outer_step": min(last_segment + 1, spec.outer_steps)}
    return {"until_step": min((last_segment + 1) * spec.segment_steps, spec.steps)}


async def replay_job(spec: TrainSpec, workers: list[str], last_segment: int, task_id: bytes = bytes(32),
                     mode: str = "butterfly", left: dict[str, int] | None = None,
                     files: Mapping[str, Path] | None = None) -> dict[str, list[str]]:
    """Segment hashes 0..last_segment of every worker that stayed (peer id -> hex hashes) by replaying
    the job; `left` maps workers that left the real run to the round they left at; `files` maps the
    spec's artifact ids to local paths."""
    left = left or {}
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
        trainers = []
        for rank, (peer, group, transport) in enumerate(zip(ordered, groups, transports)):
            averager = averager_for_group(spec, group)
            if peer in left:
                averager = LeavingAverager(averager, group, transport, left[peer])
            trainers.append(make_trainer(spec, rank, len(ordered), averager, files=files))
        until = segments_needed(spec, last_segment)
        outcomes = await asyncio.gather(*(trainer.run(**until) for trainer in trainers), return_exceptions=True)
        for peer, outcome in zip(ordered, outcomes):
            if isinstance(outcome, BaseException) and not (peer in left and isinstance(outcome, WorkerLeft)):
                raise outcome
        return {peer: list(trainer.segment_hashes[:last_segment + 1])
                for peer, trainer in zip(ordered, trainers) if peer not in left}
    finally:
        for group in groups:
            await group.close()
        for transport in transports:
            await transport.close()


def replay_job_blocking(spec: TrainSpec, workers: list[str], last_segment: int, task_id: bytes = bytes(32),
                        mode: str = "butterfly", left: dict[str, int] | None = None,
                        files: Mapping[str, Path] | None = None) -> dict[str, list[str]]:
    """`replay_job` on a fresh event loop (call it from a worker thread)."""
    return asyncio.run(replay_job(spec, workers, last_segment, task_id, mode, left, files))

"""Run one training job with `world` simulated workers in this process (LocalAveragingGroup).

This is what the convergence tests and bench/convergence.py use; real jobs use the same trainers
over the network all-reduce (see ml/compute/local_job.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ml.allreduce.receipts import WireSigner
from ml.codecs import powersgd_rank
from ml.train.averaging import Averager, LocalAveragingGroup
from ml.train.data_parallel import DataParallelTrainer
from ml.train.diloco import DiLoCoTrainer
from ml.train.faults import install as install_fault
from ml.train.powersgd_averager import PowerSGDAverager
from ml.train.progress import ProgressFeed
from ml.train.segments import MemorySink, SegmentRecorder
from ml.train.spec import TrainSpec
from ml.train.streaming_diloco import StreamingDiLoCoTrainer
from ml.train.worker import TrainerBase

TRAINERS: dict[str, type[TrainerBase]] = {"data-parallel": DataParallelTrainer, "diloco": DiLoCoTrainer,
                                          "streaming-diloco": StreamingDiLoCoTrainer}


def make_trainer(spec: TrainSpec, rank: int, world: int, averager: Averager,
                 feed: ProgressFeed | None = None, files: Mapping[str, Path] | None = None) -> TrainerBase:
    """The trainer for `spec.mode`; `files` maps the artifact ids the spec names to local paths."""
    return TRAINERS[spec.mode](spec, rank, world, averager, feed, files)


@dataclass
class SimulatedRun:
    trainers: list[TrainerBase]
    metrics: list[dict]              # final evaluation per worker

    @property
    def bytes_sent_per_worker(self) -> int:
        return max(t.bytes_sent for t in self.trainers)


def with_codec_layer(spec: TrainSpec, averager: Averager) -> Averager:
    """Wrap a plain fp32 averager in the multi-phase codec `spec.codec` needs (PowerSGD), if any."""
    rank = powersgd_rank(spec.codec)
    return averager if rank is None else PowerSGDAverager(averager, rank, spec.seed)


def build_simulated(spec: TrainSpec, world: int, feed: ProgressFeed | None = None,
                    files: Mapping[str, Path] | None = None, group: LocalAveragingGroup | None = None
                    ) -> list[TrainerBase]:
    """`world` trainers of `spec` sharing one in-process averaging group (`group`, or a new one)."""
    group = group or simulated_group(spec, world)
    return [make_trainer(spec, rank, world, with_codec_layer(spec, group.member(rank)), feed, files)
            for rank in range(world)]


def simulated_group(spec: TrainSpec, world: int, names: list[str] | None = None,
                    signers: Mapping[str, WireSigner] | None = None) -> LocalAveragingGroup:
    plain_codec = "fp32" if powersgd_rank(spec.codec) is not None else spec.codec
    return LocalAveragingGroup(world, plain_codec, spec.codec_options, names, signers)


def build_recorded(spec: TrainSpec, world: int, faults: Mapping[int, str] | None = None,
                   files: Mapping[str, Path] | None = None, fault_seed: int | None = 0,
                   names: list[str] | None = None, signers: Mapping[str, WireSigner] | None = None
                   ) -> tuple[list[TrainerBase], MemorySink]:
    """`build_simulated` with every worker keeping per-segment records (checkpoints and averages in
    one MemorySink; `trainer.recorder.records`), and the given ranks running adversary modes. With
    `names` (the workers' sorted peer ids), the records hold receipts as a network group's would,
    signed by their senders with `signers` (docs/adr/0209)."""
    group = simulated_group(spec, world, names, signers)
    trainers = build_simulated(spec, world, files=files, group=group)
    sink = MemorySink()
    for trainer in trainers:
        SegmentRecorder(sink).attach(trainer)
        mode = (faults or {}).get(trainer.rank, "")
        install_fault(trainer, mode, fault_seed)
        group.member(trainer.rank).send_zeros = mode == "poison_stealth"
    return trainers, sink


async def run_trainers(trainers: list[TrainerBase]) -> SimulatedRun:
    metrics = await asyncio.gather(*(t.run() for t in trainers))
    return SimulatedRun(trainers, list(metrics))


def train_simulated(spec: TrainSpec, world: int, feed: ProgressFeed | None = None,
                    files: Mapping[str, Path] | None = None) -> SimulatedRun:
    """Train `spec` with `world` in-process workers to the end (blocking; runs its own event loop)."""
    return asyncio.run(run_trainers(build_simulated(spec, world, feed, files)))

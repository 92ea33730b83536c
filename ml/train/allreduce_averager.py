"""Adapter from the network all-reduce (`ml.allreduce.AllReduceGroup`) to the trainers' `Averager`.

The group encodes with one stateless codec; codecs that need state on the worker side are layered
here: PowerSGD runs on top of an fp32 group (`averager_for_group`). Top-k and sign need per-worker
error feedback on what the group actually sent, which the group does not expose, so they are
refused for real groups (use them in simulation, or use int8/int4/PowerSGD).
"""
from __future__ import annotations

import torch

from ml.codecs import powersgd_rank
from ml.train.averaging import Averaged, Averager
from ml.train.compression import BIASED_CODECS
from ml.train.powersgd_averager import PowerSGDAverager
from ml.train.spec import TrainSpec


class AllReduceAverager:
    """Implements `Averager` with `await group.allreduce(tensors, round_id)`."""

    def __init__(self, group):
        self.group = group

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        result = await self.group.allreduce([t.detach().float().contiguous() for t in tensors], round_id)
        return Averaged(list(result.tensors), tuple(result.participants), int(result.bytes_sent))


def group_codec(spec: TrainSpec) -> str:
    """The codec the all-reduce group itself must use for `spec`."""
    if powersgd_rank(spec.codec) is not None:
        return "fp32"
    if spec.codec.partition("+")[0] in BIASED_CODECS:
        raise ValueError(f"codec {spec.codec!r} needs error feedback the network all-reduce does not "
                         "offer; use fp16, int8, int4 or powersgd<r>")
    return spec.codec


def averager_for_group(spec: TrainSpec, group) -> Averager:
    """The trainer-facing averager over `group` (built with codec=group_codec(spec))."""
    plain = AllReduceAverager(group)
    rank = powersgd_rank(spec.codec)
    return plain if rank is None else PowerSGDAverager(plain, rank, spec.seed)

"""Adapters from the network all-reduce (`ml.allreduce.AllReduceGroup`) to the trainers' `Averager`.

The group encodes with one stateless codec; codecs that need state on the worker side are layered
here: PowerSGD runs on top of an fp32 group, and top-k and sign (with error feedback) run as an
all-gather of contributions each worker encodes itself (`AllGatherAverager`, docs/adr/0091).
`group_codec(spec)` is the codec to build the group with, `averager_for_group(spec, group)` the
averager to train through.
"""
from __future__ import annotations

import logging

import torch

from ml.codecs import CodecError, powersgd_rank
from ml.train.averaging import Averaged, Averager
from ml.train.compression import BIASED_CODECS, Compressor, flatten
from ml.train.powersgd_averager import PowerSGDAverager
from ml.train.reproducibility import in_compute_thread
from ml.train.spec import TrainSpec

log = logging.getLogger(__name__)


class AllReduceAverager:
    """Implements `Averager` with `await group.allreduce(tensors, round_id)`."""

    def __init__(self, group):
        self.group = group

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        result = await self.group.allreduce([t.detach().float().contiguous() for t in tensors], round_id)
        return Averaged(list(result.tensors), tuple(result.participants), int(result.bytes_sent),
                        tuple(result.received))


class AllGatherAverager:
    """Implements `Averager` for top-k and sign over a real group: this worker encodes its flat
    contribution once with its own `Compressor` (error feedback: the residual x - decode(encode(x))
    stays here and is part of `state_dict`), and `group.allgather_mean` delivers every worker's
    encoding to every other; each averages the decodings in sorted member order, as
    `LocalAveragingGroup` does in simulation. A contribution that cannot be encoded (non-finite
    gradient) leaves this worker out of the round (ExcludedFromRound), its residual unchanged."""

    def __init__(self, group, codec: str, options: dict | None = None):
        self.group = group
        self.compressor = Compressor(codec, options)
        self.last_encoded: bytes | None = None   # this worker's encoding of the last round

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        flat = flatten(tensors)
        try:
            encoded = await in_compute_thread(self.compressor.encode, flat)
        except CodecError as exc:
            log.warning("round %d: cannot encode this worker's contribution: %s", round_id, exc)
            encoded = None
        self.last_encoded = encoded
        result = await self.group.allgather_mean(encoded, self.compressor.codec,
                                                 [tuple(t.shape) for t in tensors], round_id)
        return Averaged(list(result.tensors), tuple(result.participants), int(result.bytes_sent),
                        tuple(result.received))

    def state_dict(self) -> dict:
        return self.compressor.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.compressor.load_state_dict(state)


def group_codec(spec: TrainSpec) -> str:
    """The codec the all-reduce group itself must use for `spec` (fp32 where the averager layers a
    stateful codec on top: PowerSGD averages its factors in fp32; top-k and sign bring their own)."""
    if powersgd_rank(spec.codec) is not None or _all_gathered(spec):
        return "fp32"
    return spec.codec


def averager_for_group(spec: TrainSpec, group) -> Averager:
    """The trainer-facing averager over `group` (built with codec=group_codec(spec))."""
    if _all_gathered(spec):
        return AllGatherAverager(group, spec.codec, spec.codec_options)
    plain = AllReduceAverager(group)
    rank = powersgd_rank(spec.codec)
    return plain if rank is None else PowerSGDAverager(plain, rank, spec.seed)


def _all_gathered(spec: TrainSpec) -> bool:
    return spec.codec.partition("+")[0] in BIASED_CODECS

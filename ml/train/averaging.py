"""What a trainer needs from its group: average a list of tensors for a round.

`Averager` is the interface; `LocalAveragingGroup` simulates `world` peers inside one process (each
member compresses its contribution with its own `Compressor`, like a peer of a ring all-reduce), so
trainers and convergence tests run without a network. The adapter to the real all-reduce lives in
`ml/train/allreduce_averager.py`.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

import torch

from ml.train.compression import Compressor, flatten, unflatten
from ml.train.reproducibility import in_compute_thread


@dataclass(frozen=True)
class Averaged:
    tensors: list[torch.Tensor]   # the group mean, same shapes as the contribution
    participants: tuple           # who contributed (ranks or peer ids), identical on every member
    bytes_sent: int               # bytes this member sent for the round
    received: tuple = ()          # ml.allreduce.receipts.Receipt per sender (network groups only)


class Averager(Protocol):
    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        """The mean of every participant's `tensors` for `round_id` (the same on every member)."""
        ...


class LocalAveragingGroup:
    """`world` simulated peers averaging compressed contributions in one event loop.

    Dense codecs follow the butterfly of docs/adr/0034: every contribution is encoded once, summed
    exactly in fp32 in rank order, and the mean is encoded once; each member sends 2*(world-1)/world
    of an encoding. Sparse codecs (top-k, sign) cannot be re-encoded after summing, so each member
    sends its encoding to the world-1 others (all-gather of contributions).
    """

    def __init__(self, world: int, codec: str = "fp32", codec_options: dict | None = None):
        if world < 1:
            raise ValueError("a group needs at least one member")
        self.world = world
        self._codec = codec
        self._codec_options = codec_options or {}
        self._rounds: dict[int, dict[int, bytes]] = {}
        self._results: dict[int, asyncio.Future] = {}
        self.members = [LocalMember(self, rank, Compressor(codec, self._codec_options))
                        for rank in range(world)]

    def member(self, rank: int) -> LocalMember:
        return self.members[rank]

    def _contribute(self, round_id: int, rank: int, data: bytes) -> asyncio.Future:
        contributions = self._rounds.setdefault(round_id, {})
        if rank in contributions:
            raise RuntimeError(f"rank {rank} contributed twice to round {round_id}")
        contributions[rank] = data
        return self._results.setdefault(round_id, asyncio.get_running_loop().create_future())

    def _mean(self, contributions: dict[int, bytes], numel: int) -> torch.Tensor:
        decoder = Compressor(self._codec, self._codec_options, error_feedback=False)
        total = torch.zeros(numel, dtype=torch.float32)
        for rank in sorted(contributions):
            total += decoder.decode(contributions[rank], numel)
        mean = total / self.world
        if decoder.dense:
            mean = decoder.decode(decoder.encode(mean), numel)
        return mean

    async def _complete(self, round_id: int, numel: int) -> None:
        contributions = self._rounds.pop(round_id)
        mean = await in_compute_thread(self._mean, contributions, numel)
        self._results.pop(round_id).set_result(mean)


class LocalMember:
    """One simulated peer of a LocalAveragingGroup; implements `Averager`."""

    def __init__(self, group: LocalAveragingGroup, rank: int, compressor: Compressor):
        self.group = group
        self.rank = rank
        self.compressor = compressor
        self.last_encoded: bytes | None = None   # this member's encoding, when its codec keeps state

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        flat = flatten(tensors)
        data = await in_compute_thread(self.compressor.encode, flat)
        self.last_encoded = data if self.compressor.error_feedback else None
        result = self.group._contribute(round_id, self.rank, data)
        if len(self.group._rounds[round_id]) == self.group.world:
            await self.group._complete(round_id, flat.numel())
        mean = await result
        world = self.group.world
        if self.compressor.dense:
            sent = (2 * (world - 1) * len(data)) // world
        else:
            sent = (world - 1) * len(data)
        return Averaged(unflatten(mean, tensors), tuple(range(world)), sent)

    def state_dict(self) -> dict:
        return self.compressor.state_dict() if self.compressor.error_feedback else {}

    def load_state_dict(self, state: dict) -> None:
        if self.compressor.error_feedback:
            self.compressor.load_state_dict(state)

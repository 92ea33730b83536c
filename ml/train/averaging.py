"""What a trainer needs from its group: average a list of tensors for a round.

`Averager` is the interface; `LocalAveragingGroup` simulates `world` peers inside one process (each
member compresses its contribution with its own `Compressor`, like a peer of a ring all-reduce), so
trainers and convergence tests run without a network. The adapter to the real all-reduce lives in
`ml/train/allreduce_averager.py`.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from ml.allreduce.receipts import Receipt, WireSigner
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


SIMULATED_CHUNK = 1 << 16   # values per chunk of the emulated butterfly receipts


class LocalAveragingGroup:
    """`world` simulated peers averaging compressed contributions in one event loop.

    Dense codecs follow the butterfly of docs/adr/0034: every contribution is encoded once, summed
    exactly in fp32 in rank order, and the mean is encoded once; each member sends 2*(world-1)/world
    of an encoding. Sparse codecs (top-k, sign) cannot be re-encoded after summing, so each member
    sends its encoding to the world-1 others (all-gather of contributions).

    With `names` (the members' peer ids, by rank), every member's `Averaged.received` holds the
    receipts the network group would give it (ml.allreduce.receipts): for sparse codecs the digest of
    each other member's encoding; for dense ones the digest of the chunks of each other member's
    contribution in the shard this member would reduce in an equal-rate butterfly plan (the simulated
    mean itself is computed as above, not from those chunks). With `signers` (peer id -> its
    `ml.allreduce.receipts.WireSigner`), each receipt of a non-empty range carries its sender's
    signature, as a signing network group's does (docs/adr/0209).
    """

    def __init__(self, world: int, codec: str = "fp32", codec_options: dict | None = None,
                 names: list[str] | None = None, signers: Mapping[str, WireSigner] | None = None):
        if world < 1:
            raise ValueError("a group needs at least one member")
        if names is not None and (len(names) != world or sorted(names) != names or len(set(names)) != world):
            raise ValueError("names are the members' distinct peer ids, sorted, one per rank")
        if signers is not None and (names is None or set(signers) != set(names)):
            raise ValueError("signers are one per named member")
        self.world = world
        self.names = names
        self.signers = signers
        self._codec = codec
        self._codec_options = codec_options or {}
        self._rounds: dict[int, dict[int, bytes]] = {}
        self._sent: dict[int, dict[int, torch.Tensor]] = {}
        self._results: dict[int, asyncio.Future] = {}
        self.members = [LocalMember(self, rank, Compressor(codec, self._codec_options))
                        for rank in range(world)]

    def member(self, rank: int) -> LocalMember:
        return self.members[rank]

    def _contribute(self, round_id: int, rank: int, data: bytes, flat: torch.Tensor) -> asyncio.Future:
        contributions = self._rounds.setdefault(round_id, {})
        if rank in contributions:
            raise RuntimeError(f"rank {rank} contributed twice to round {round_id}")
        contributions[rank] = data
        self._sent.setdefault(round_id, {})[rank] = flat
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

    def _receipts(self, round_id: int, contributions: dict[int, bytes], flats: dict[int, torch.Tensor]) -> list[tuple]:
        """Per rank, the receipts of what it received from each other member (see the class doc)."""
        from ml.allreduce.plan import make_plan
        from ml.allreduce.receipts import expected_part_digest
        from ml.codecs import get_codec

        names = self.names
        if names is None:
            return [()] * self.world
        if not Compressor(self._codec, self._codec_options, error_feedback=False).dense:
            digests = {s: hashlib.sha256(contributions[s]).hexdigest() for s in contributions}
            return [tuple(self._receipt(round_id, s, r, digests[s], 0, 0, 0) for s in sorted(contributions) if s != r)
                    for r in range(self.world)]
        numel = flats[0].numel()
        plan = make_plan(names, set(), {}, numel, SIMULATED_CHUNK, self._codec)
        codec = get_codec(self._codec)
        out = []
        for r in range(self.world):
            start, stop = plan.shards[plan.shard_of(names[r])]
            out.append(tuple(self._receipt(round_id, s, r, expected_part_digest(codec, flats[s], start, stop,
                                                                                SIMULATED_CHUNK),
                                           start, stop, SIMULATED_CHUNK) for s in sorted(flats) if s != r))
        return out

    def _receipt(self, round_id: int, sender: int, receiver: int, digest: str, start: int, stop: int,
                 chunk: int) -> Receipt:
        """The receipt rank `receiver` keeps of rank `sender`'s bytes, signed by the sender if it signs."""
        assert self.names is not None   # receipts are made for named members only
        name = self.names[sender]
        if self.signers is None or (chunk and start == stop):   # an empty range carries no bytes to sign
            return Receipt(name, digest, start, stop, chunk)
        signature = self.signers[name].sign(round_id, self.names[receiver], digest, start, stop, chunk)
        return Receipt(name, digest, start, stop, chunk, bytes.fromhex(signature))

    async def _complete(self, round_id: int, numel: int) -> None:
        contributions = self._rounds.pop(round_id)
        flats = self._sent.pop(round_id)
        mean = await in_compute_thread(self._mean, contributions, numel)
        receipts = await in_compute_thread(self._receipts, round_id, contributions, flats)
        self._results.pop(round_id).set_result((mean, receipts))


class LocalMember:
    """One simulated peer of a LocalAveragingGroup; implements `Averager`."""

    def __init__(self, group: LocalAveragingGroup, rank: int, compressor: Compressor):
        self.group = group
        self.rank = rank
        self.compressor = compressor
        self.last_encoded: bytes | None = None   # this member's encoding, when its codec keeps state
        self.send_zeros = False                  # fault_inject=poison_stealth (ml.train.faults)

    async def average(self, tensors: list[torch.Tensor], round_id: int) -> Averaged:
        flat = flatten(tensors)
        data = await in_compute_thread(self.compressor.encode, flat)
        self.last_encoded = data if self.compressor.error_feedback else None
        if self.send_zeros:
            flat = torch.zeros_like(flat)
            data = await in_compute_thread(
                Compressor(self.group._codec, self.group._codec_options, error_feedback=False).encode, flat)
        result = self.group._contribute(round_id, self.rank, data, flat)
        if len(self.group._rounds[round_id]) == self.group.world:
            await self.group._complete(round_id, flat.numel())
        mean, receipts = await result
        world = self.group.world
        if self.compressor.dense:
            sent = (2 * (world - 1) * len(data)) // world
        else:
            sent = (world - 1) * len(data)
        return Averaged(unflatten(mean, tensors), tuple(range(world)), sent, receipts[self.rank])

    def state_dict(self) -> dict:
        return self.compressor.state_dict() if self.compressor.error_feedback else {}

    def load_state_dict(self, state: dict) -> None:
        if self.compressor.error_feedback:
            self.compressor.load_state_dict(state)

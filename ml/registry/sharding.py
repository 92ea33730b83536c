"""Deterministic seeds and data sharding: which examples worker `rank` of `world` sees at each step.

Everything here is a pure function of (seed, rank, world, step/epoch), so any verifier can recompute
exactly which data a worker trained on.
"""
from __future__ import annotations

import hashlib

import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts (stable across processes and Python versions)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(*parts: object) -> torch.Generator:
    """A CPU torch.Generator seeded from `parts`."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(*parts))
    return gen


def shard_indices(n: int, rank: int, world: int, seed: int, epoch: int) -> torch.Tensor:
    """Worker `rank`'s share of a seeded permutation of range(n) for `epoch` (strided, disjoint)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    order = torch.randperm(n, generator=generator("epoch-permutation", seed, epoch))
    return order[rank::world]


def contiguous_shard(length: int, rank: int, world: int) -> tuple[int, int]:
    """Bounds [start, end) of worker `rank`'s contiguous slice of a sequence of `length` items."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    return (length * rank) // world, (length * (rank + 1)) // world

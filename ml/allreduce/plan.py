"""The layout of one all-reduce attempt: who reduces which contiguous shard, cut into which chunks.

Pure and deterministic: every member derives the same plan from the same agreed inputs (members,
reducers, upload-rate table, numel, chunk size, codec), and a digest of it travels with the first
chunk so a member that planned differently is caught instead of averaging mismatched ranges.
Shard sizes are proportional to the reducers' measured upload rates.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .receipts import chunk_ranges

ALIGN = 256  # shard boundaries fall on multiples of this (keeps codec blocks whole)


@dataclass(frozen=True)
class Plan:
    members: tuple[str, ...]          # sorted; the order of summation
    reducers: tuple[str, ...]         # sorted subset of members; reducer i owns shards[i]
    shards: tuple[tuple[int, int], ...]  # (start, stop) per reducer, covering [0, numel)
    chunk_numel: int
    codec: str
    numel: int

    def chunks(self, shard: int) -> list[tuple[int, int]]:
        start, stop = self.shards[shard]
        return chunk_ranges(start, stop, self.chunk_numel)

    def shard_of(self, reducer: str) -> int:
        return self.reducers.index(reducer)

    def digest(self) -> str:
        blob = json.dumps([self.members, self.reducers, self.shards, self.chunk_numel, self.codec,
                           self.numel]).encode()
        return hashlib.blake2b(blob, digest_size=8).hexdigest()


def split_proportional(numel: int, weights: list[float], align: int = ALIGN) -> list[tuple[int, int]]:
    """Contiguous ranges over [0, numel) with sizes proportional to `weights`, on `align` bounds."""
    if not weights or any(not w > 0 for w in weights):
        raise ValueError("weights must be positive")
    total = sum(weights)
    bounds = [0]
    acc = 0.0
    for w in weights[:-1]:
        acc += w
        cut = int(round(numel * acc / total / align)) * align
        bounds.append(min(max(cut, bounds[-1]), numel))
    bounds.append(numel)
    return [(bounds[i], bounds[i + 1]) for i in range(len(weights))]


def make_plan(members: list[str], non_reducers: set[str], rates: dict[str, float], numel: int,
              chunk_numel: int, codec: str) -> Plan:
    """Plan an attempt. Reducers are members not marked non-reducer (all members if none is left);
    an unmeasured reducer gets the median measured rate (or 1.0 when none is measured)."""
    members = sorted(members)
    reducers = [m for m in members if m not in non_reducers] or list(members)
    measured = sorted(r for m, r in rates.items() if m in reducers and r > 0)
    default = measured[len(measured) // 2] if measured else 1.0
    weights = [rates.get(m, 0.0) if rates.get(m, 0.0) > 0 else default for m in reducers]
    shards = split_proportional(numel, weights)
    return Plan(tuple(members), tuple(reducers), tuple(shards), chunk_numel, codec, numel)

"""The block being executed, as the state handlers see it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockContext:
    height: int
    time_ms: int
    proposer: str
    block_hash: bytes
    prev_block_hash: bytes
    beacon: bytes = b""    # this block's random beacon (consensus/beacon.py): the draws' randomness, ADR 0202

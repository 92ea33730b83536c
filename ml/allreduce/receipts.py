"""What a member received from each other member in a round (`Receipt`), and the pure functions both
sides of the wire share, so a sender's honest bytes can be recomputed by anyone (docs/adr/0167,
"Receiver-side evidence").

Butterfly: a reducer of [start, stop) receives from every member the chunks `chunk_ranges(start,
stop, chunk)` of its contribution, each `encode_local(codec, flat[a:b])`; its receipt is
`payload_digest` over those payloads in chunk order. All-gather: the sender's whole encoding
(start = stop = chunk = 0). `expected_part_digest` recomputes the butterfly digest from a sender's
flat contribution, with the same `chunk_ranges` and `encode_local` the sender uses.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ml.codecs.base import Codec

from .payloads import Payload, encode_local


@dataclass(frozen=True)
class Receipt:
    sender: str
    digest: str     # sha256 hex of the bytes received from `sender`
    start: int      # butterfly: the range of the sender's contribution this member reduced
    stop: int       # (all-gather: 0, 0 -- the whole encoding)
    chunk: int      # butterfly: the chunk size the range was cut into (all-gather: 0)


def chunk_ranges(start: int, stop: int, chunk: int) -> list[tuple[int, int]]:
    """The chunks [a, b) a shard [start, stop) travels in."""
    return [(s, min(s + chunk, stop)) for s in range(start, stop, chunk)]


def feed(hasher: hashlib._Hash, payload: Payload) -> None:
    """Hash `payload` as it goes on the wire (a (header, body) tuple is sent concatenated)."""
    for part in payload if isinstance(payload, tuple) else (payload,):
        hasher.update(part)


def payload_digest(payloads: Iterable[Payload]) -> str:
    hasher = hashlib.sha256()
    for payload in payloads:
        feed(hasher, payload)
    return hasher.hexdigest()


def expected_part_digest(codec: Codec, flat: torch.Tensor, start: int, stop: int, chunk: int) -> str:
    """The digest an honest sender with contribution `flat` produces at the reducer of [start, stop)."""
    if not 0 <= start <= stop <= flat.numel() or chunk <= 0:
        raise ValueError(f"range [{start}, {stop}) chunk {chunk} does not fit {flat.numel()} values")
    return payload_digest(encode_local(codec, flat[a:b], "auditor") for a, b in chunk_ranges(start, stop, chunk))

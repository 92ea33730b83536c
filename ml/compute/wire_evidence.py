"""Receiver-side evidence (docs/adr/0167, "Receiver-side evidence"; signed since docs/adr/0209): what a
worker's co-workers recorded receiving from it (`WireReceipt`s in their segment records), checked
against the bytes the worker's honest contribution makes on the wire, recomputed by the replay with the
same pure functions the sending code uses (ml.allreduce.receipts).

A worker that commits its honest contribution but sends something else (fault `poison_stealth`)
replays to its committed hashes; its receivers' receipts are what name it. Every receipt carries the
sender's signature of what it sent (the receiver refused bytes without one), so a receipt is proof,
not testimony: one receipt the worker signed over bytes other than its honest ones names it, and a
receipt it did not sign names nobody, however many co-workers hold one (no majority of co-workers
can frame a sender). A record holding a receipt its sender did not sign is itself false: no honest
receiver of a signing group keeps one (`unsigned_receipt`).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ml.allreduce.receipts import expected_part_digest, receipt_message
from ml.codecs.base import Codec
from ml.compute.segment_record import SegmentRecord, WireReceipt
from node.identity import verify_by_peer_id

MAX_CLAIM_CHUNKS = 4096   # a receipt cut finer than this is no honest plan's (the group's chunks are 2^18
                          # values): a disagreeing vote, not minutes of re-encoding for the judge


@dataclass(frozen=True)
class Claim:
    """Receiver `receiver` recorded `receipt` from the audited worker at step `offset` of the segment."""
    receiver: str
    offset: int
    receipt: WireReceipt


def claims_about(worker: str, records: Mapping[str, SegmentRecord]) -> list[Claim]:
    """Every receipt naming `worker` as sender in the co-workers' `records` (receiver -> record)."""
    out = []
    for receiver in sorted(records):
        if receiver == worker:
            continue
        for offset, receipts in enumerate(records[receiver].received):
            # an empty butterfly range (a reducer with no shard of a small tensor) says nothing
            out += [Claim(receiver, offset, r) for r in receipts if r.sender == worker and carries_bytes(r)]
    return out


def flat_contribution(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A contribution as the group flattens it (1-D float32, CPU)."""
    return torch.cat([t.detach().to("cpu", torch.float32).reshape(-1) for t in tensors])


def honest_digest(codec: Codec, flat: torch.Tensor, encoded: bytes | None, receipt: WireReceipt) -> str | None:
    """The digest an honest sender's round makes at the receiver of `receipt` (all-gather: its whole
    encoding; butterfly: the chunks of its range), or None where the receipt fits no honest round."""
    if receipt.chunk == 0:
        return None if encoded is None else hashlib.sha256(encoded).hexdigest()
    if -(-(receipt.stop - receipt.start) // receipt.chunk) > MAX_CLAIM_CHUNKS:
        return None
    try:
        return expected_part_digest(codec, flat, receipt.start, receipt.stop, receipt.chunk)
    except ValueError:
        return None


def carries_bytes(receipt: WireReceipt) -> bool:
    """Whether `receipt` is of bytes that were sent (an empty butterfly range says nothing)."""
    return receipt.chunk == 0 or receipt.start < receipt.stop


def signed(task_id: bytes, receiver: str, receipt: WireReceipt) -> bool:
    """Whether `receipt`, kept by `receiver` in task `task_id`, carries its sender's signature of what it names."""
    if not receipt.signature:
        return False
    message = receipt_message(task_id, receipt.round, receipt.sender, receiver, receipt.digest, receipt.start,
                              receipt.stop, receipt.chunk)
    return verify_by_peer_id(receipt.sender, message, bytes.fromhex(receipt.signature))


def wire_verdict(task_id: bytes, checked: list[tuple[Claim, bool]]) -> int | None:
    """The first step offset where a receiver holds the worker's signature of bytes other than the honest
    ones; None if there is none (unsigned claims are not evidence)."""
    for claim, agrees in sorted(checked, key=lambda item: (item[0].offset, item[0].receiver)):
        if not agrees and signed(task_id, claim.receiver, claim.receipt):
            return claim.offset
    return None


def unsigned_receipt(task_id: bytes, worker: str, record: SegmentRecord) -> int | None:
    """The first step offset where `worker`'s own record holds a receipt of sent bytes that its sender did
    not sign (a receipt made up by the worker); None if every one is signed."""
    for offset, receipts in enumerate(record.received):
        if any(carries_bytes(r) and not signed(task_id, worker, r) for r in receipts):
            return offset
    return None

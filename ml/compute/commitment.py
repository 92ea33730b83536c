"""What a worker commits on chain for a task: the Merkle root of its segment records (`of_records`,
docs/adr/0167; `of` is the older root of bare segment hashes) and its result hash.

Leaves and inner nodes are hashed with distinct prefixes (sha256(0x00 || leaf), sha256(0x01 || l || r)),
an odd node is carried up unchanged, so a list and its padded variants never share a root.
`audited_segment` turns the task's audit seed into the segment a given verifier replays for a given
worker: deterministic, so everyone can check the choice, and different per (verifier, worker).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from consensus.block import merkle_root as block_merkle_root
from ml.compute.segment_record import leaves, root


class BadCommitment(ValueError):
    """Segment hashes that are not 32-byte hex digests, or an empty list."""


def segment_digests(segment_hashes: list[str]) -> list[bytes]:
    """The 32-byte digests of hex segment hashes; raises BadCommitment on anything else."""
    if not segment_hashes:
        raise BadCommitment("a result needs at least one segment hash")
    try:
        digests = [bytes.fromhex(h) for h in segment_hashes]
    except (TypeError, ValueError):
        raise BadCommitment("segment hashes must be hex strings") from None
    if any(len(d) != 32 for d in digests):
        raise BadCommitment("segment hashes must be 32 bytes")
    return digests


def merkle_root(segment_hashes: list[str]) -> bytes:
    """The Merkle root of a non-empty list of hex sha256 segment hashes (the ledger's RFC 6962 tree)."""
    return block_merkle_root(segment_digests(segment_hashes))


@dataclass(frozen=True)
class Commitment:
    segments_root: bytes
    result_hash: bytes
    segments: int

    @classmethod
    def of(cls, segment_hashes: list[str], params_hash: str) -> Commitment:
        result = bytes.fromhex(params_hash)
        if len(result) != 32:
            raise BadCommitment("the result hash must be 32 bytes")
        return cls(merkle_root(segment_hashes), result, len(segment_hashes))

    @classmethod
    def of_records(cls, task_id: bytes, worker: str, records: list, weights_id: str) -> Commitment:
        """The commitment to per-worker segment records (ml.compute.segment_record): the Merkle root of
        their leaves, their count, and the weights artifact id as the result hash."""
        result = bytes.fromhex(weights_id)
        if len(result) != 32:
            raise BadCommitment("the result hash must be 32 bytes")
        return cls(root(leaves(task_id, worker, records)), result, len(records))

    def payload(self, task_id: bytes) -> dict:
        """The commit_result transaction payload."""
        return {"task_id": task_id, "segments_root": self.segments_root, "result_hash": self.result_hash,
                "segments": self.segments}


def audited_segment(audit_seed: bytes, verifier: str, worker: str, segments: int) -> int:
    """The segment (0-based) that `verifier` replays for `worker`, chosen by the task's audit seed."""
    if segments < 1:
        raise ValueError("a commitment has at least one segment")
    digest = hashlib.sha256(b"dekube/audit\x00" + audit_seed + verifier.encode() + b"\x00" + worker.encode()).digest()
    return int.from_bytes(digest[:8], "big") % segments

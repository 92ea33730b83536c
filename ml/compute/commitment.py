"""What a worker commits on chain for a task: the Merkle root of its per-segment records' leaves
(ml/compute/segment_record.py, docs/adr/0167), their count, and its result hash (the weights artifact id).
"""
from __future__ import annotations

from dataclasses import dataclass

from ml.compute.segment_record import leaves, root


class BadCommitment(ValueError):
    """A result hash that is not 32 bytes."""


@dataclass(frozen=True)
class Commitment:
    segments_root: bytes
    result_hash: bytes
    segments: int

    @classmethod
    def of_records(cls, task_id: bytes, worker: str, records: list, weights_id: str) -> Commitment:
        """The commitment to per-worker segment records (ml.compute.segment_record): the Merkle root of
        their leaves, their count, and the weights artifact id as the result hash."""
        result = bytes.fromhex(weights_id)
        if len(result) != 32:
            raise BadCommitment("the result hash must be 32 bytes")
        return cls(root(leaves(task_id, worker, records)), result, records[-1].index + 1)

    def payload(self, task_id: bytes) -> dict:
        """The commit_result transaction payload."""
        return {"task_id": task_id, "segments_root": self.segments_root, "result_hash": self.result_hash,
                "segments": self.segments}

"""This node's audit answers and referee votes, committed then revealed (docs/adr/0202, 0210).

A drawn verifier first sends ``audit_commit``: a hash of its answer, a blinding and its peer ID
(consensus/state/answers.py); once every verifier of the slot has committed, the ledger opens the reveal
window and the node sends ``audit_result`` with the answer and the blinding. The blinding is derived from
the node's secret key and the slot (a keyed hash), so a node that restarts between the two can still
reveal: it replays the segment again (deterministic) and derives the same blinding. A drawn referee does
the same with ``referee_commit`` and ``referee_vote`` (its commitment also binds the panel it sits on).
Judgements are kept in memory for the reveal, the oldest dropped past ``MAX_KEPT``.
"""
from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict

from consensus.state.answers import answer_commitment, vote_commitment
from ml.compute.duties import Duty
from ml.compute.verification_flow import Judgement
from node.identity import Identity

MAX_KEPT = 4096
_BLINDING_DOMAIN = b"dekube/audit-blinding/v1\x00"
_VOTE_LABEL = b"referee-vote"


class SealedAnswers:
    """Commitments and reveals of one node's audit answers."""

    def __init__(self, identity: Identity) -> None:
        self._key = hashlib.sha256(_BLINDING_DOMAIN + identity.seed).digest()
        self._peer_id = identity.peer_id
        self._kept: OrderedDict[tuple[str, int], Judgement] = OrderedDict()

    def blinding(self, task_id: bytes, slot: int, label: bytes = b"") -> bytes:
        return hmac.new(self._key, label + task_id + slot.to_bytes(4, "big"), hashlib.sha256).digest()

    def recall(self, duty: Duty) -> Judgement | None:
        """The judgement this node committed to for ``duty``'s slot, if it still holds it."""
        return self._kept.get((duty.task_id, duty.slot))

    def forget(self, task_id: str, slot: int) -> None:
        """Drop the judgement kept for a slot whose verifiers the ledger asked again (ADR 0207)."""
        self._kept.pop((task_id, slot), None)

    def _keep(self, task_id: bytes, slot: int, judgement: Judgement) -> None:
        self._kept[(task_id.hex(), slot)] = judgement
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)

    def commit_payload(self, task_id: bytes, slot: int, judgement: Judgement) -> dict:
        """The ``audit_commit`` payload for ``judgement`` (kept for the reveal)."""
        self._keep(task_id, slot, judgement)
        return {"task_id": task_id, "slot": slot, "commitment": answer_commitment(
            task_id, slot, self._peer_id, judgement.match, judgement.evidence, judgement.step,
            self.blinding(task_id, slot))}

    def reveal_payload(self, task_id: bytes, slot: int, judgement: Judgement) -> dict:
        """The ``audit_result`` payload that opens the commitment of ``judgement``."""
        return {**judgement.audit_payload(task_id, slot), "blinding": self.blinding(task_id, slot)}

    def vote_commit_payload(self, task_id: bytes, slot: int, panel: int, judgement: Judgement) -> dict:
        """The ``referee_commit`` payload for ``judgement``, a referee of ``panel`` (kept for the reveal)."""
        self._keep(task_id, slot, judgement)
        return {"task_id": task_id, "slot": slot, "commitment": vote_commitment(
            task_id, slot, self._peer_id, panel, judgement.match, judgement.evidence,
            self.blinding(task_id, slot, _VOTE_LABEL))}

    def vote_reveal_payload(self, task_id: bytes, slot: int, judgement: Judgement) -> dict:
        """The ``referee_vote`` payload that opens the commitment of ``judgement``."""
        return {**judgement.vote_payload(task_id, slot), "blinding": self.blinding(task_id, slot, _VOTE_LABEL)}

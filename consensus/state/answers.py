"""Verifier answers and referee votes committed, then revealed (docs/adr/0202, 0210): nobody can copy a
judgement it has not seen.

A drawn verifier first sends ``audit_commit`` with ``answer_commitment`` (a hash of its answer, a
random blinding and its own peer ID) by its answer deadline. Once every verifier of the slot has
committed or been given up for silence (consensus/state/audits.py: redraws happen before any reveal),
the reveal window opens for ``audit_reveal_s``; each verifier then sends ``audit_result`` with the
answer and the blinding, which must hash to its commitment. A copied commitment cannot be revealed
(it binds the first verifier's peer ID and blinding), and no answer is public before every commitment
is fixed. A commitment never revealed is slashed like a false answer at finalize.

Referees do the same (ADR 0210): ``referee_commit`` by the panel's referee deadline, then, once every
referee of the slot has committed or the deadline passed, ``referee_vote`` reveals the vote in the
slot's ``referee_reveal_deadline`` window; a referee's commitment binds its peer ID and the panel it
sits on, so a late referee cannot copy an earlier one's vote from the mempool.
"""
from __future__ import annotations

import hashlib

from consensus.genesis import Params
from consensus.state.audits import advance_task, slot_of
from consensus.state.context import BlockContext
from consensus.state.deadlines import passed
from consensus.state.store import TASK, LedgerState
from consensus.tx import Tx
from consensus.txcodes import TxCode, TxError

_DOMAIN = b"dekube/audit-answer/v1\x00"
_VOTE_DOMAIN = b"dekube/referee-vote/v1\x00"


def answer_commitment(task_id: bytes, slot: int, verifier: str, match: bool, evidence: bytes, step: int,
                      blinding: bytes) -> bytes:
    """What ``audit_commit`` carries: sha256 over the slot, the verifier, its answer and a blinding."""
    who = verifier.encode()
    return hashlib.sha256(_DOMAIN + task_id + slot.to_bytes(4, "big") + len(who).to_bytes(1, "big") + who
                          + (b"\x01" if match else b"\x00") + evidence + step.to_bytes(8, "big")
                          + blinding).digest()


def vote_commitment(task_id: bytes, slot: int, referee: str, panel: int, match: bool, evidence: bytes,
                    blinding: bytes) -> bytes:
    """What ``referee_commit`` carries: sha256 over the slot, the referee, its panel, its vote and a blinding."""
    who = referee.encode()
    return hashlib.sha256(_VOTE_DOMAIN + task_id + slot.to_bytes(4, "big") + len(who).to_bytes(1, "big") + who
                          + panel.to_bytes(1, "big") + (b"\x01" if match else b"\x00") + evidence
                          + blinding).digest()


def _entry(slot: dict, sender: str, seats: str = "verifiers", seat: str = "verifier") -> dict:
    """The sender's seat among the slot's ``seats`` (verifiers, or referees); else UNAUTHORIZED."""
    entry = next((v for v in slot[seats] if v[seat] == sender), None)
    if entry is None:
        raise TxError(TxCode.UNAUTHORIZED, f"the sender is not a drawn {seat} of slot {slot['slot']}")
    return entry


def apply_audit_commit(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """A drawn verifier's sealed answer, before its deadline and before the reveals open."""
    p = tx.payload
    task, slot = slot_of(state, tx)
    entry = _entry(slot, tx.sender)
    if entry.get("commitment") is not None:
        raise TxError(TxCode.ALREADY_KNOWN, "this verifier already committed its answer")
    if passed(entry["deadline"], ctx) or slot.get("reveal_deadline") or slot["dispute_deadline"] or slot["referees"]:
        raise TxError(TxCode.BAD_STATE, f"the answer deadline (block time {entry['deadline']} ms) has passed")
    entry["commitment"] = p["commitment"]
    state.touch(TASK, p["task_id"])
    state.events.append({"type": "audit_committed", "task_id": p["task_id"], "slot": p["slot"], "verifier": tx.sender})
    advance_task(state, params, ctx, p["task_id"], task, closing=False)


def apply_audit_result(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """A verifier's revealed answer: match, its evidence (sha256 over the salt and the gradients it
    recomputed), the first divergent step (0 with a match) and the blinding of its commitment, in the
    reveal window."""
    p = tx.payload
    task, slot = slot_of(state, tx)
    if p["match"] and p["step"]:
        raise TxError(TxCode.BAD_PAYLOAD, "step is the first divergent step: 0 when the segment matches")
    entry = _entry(slot, tx.sender)
    if entry.get("commitment") is None or entry.get("unrevealed"):
        raise TxError(TxCode.BAD_STATE, "this verifier has no sealed answer to reveal (audit_commit first)")
    if entry["answer"] is not None:
        raise TxError(TxCode.ALREADY_KNOWN, "this verifier already answered this slot")
    if not slot.get("reveal_deadline"):
        raise TxError(TxCode.BAD_STATE, "reveals open once every verifier of the slot has committed")
    if passed(slot["reveal_deadline"], ctx):
        raise TxError(TxCode.BAD_STATE, f"the reveal deadline (block time {slot['reveal_deadline']} ms) has passed")
    if answer_commitment(p["task_id"], p["slot"], tx.sender, p["match"], p["evidence"], p["step"],
                         p["blinding"]) != entry["commitment"]:
        raise TxError(TxCode.BAD_PAYLOAD, "the answer does not match this verifier's commitment")
    entry["answer"] = {"match": p["match"], "evidence": p["evidence"], "step": p["step"]}
    state.touch(TASK, p["task_id"])
    state.events.append({"type": "audit_answered", "task_id": p["task_id"], "slot": p["slot"],
                         "verifier": tx.sender, "match": p["match"], "evidence": p["evidence"], "step": p["step"]})
    advance_task(state, params, ctx, p["task_id"], task, closing=False)


# ---- referee votes (ADR 0210) ------------------------------------------------------------------

def apply_referee_commit(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """A drawn referee's sealed vote, before the referee deadline and before the slot's votes open."""
    p = tx.payload
    task, slot = slot_of(state, tx)
    entry = _entry(slot, tx.sender, "referees", "referee")
    if entry.get("commitment") is not None or entry["vote"] is not None or entry.get("unrevealed"):
        raise TxError(TxCode.ALREADY_KNOWN, "this referee already committed its vote")
    if slot.get("referee_reveal_deadline") or passed(slot["referee_deadline"], ctx):
        raise TxError(TxCode.BAD_STATE, f"the referee deadline (block time {slot['referee_deadline']} ms) has passed")
    entry["commitment"] = p["commitment"]
    state.touch(TASK, p["task_id"])
    state.events.append({"type": "referee_committed", "task_id": p["task_id"], "slot": p["slot"],
                         "referee": tx.sender})
    advance_task(state, params, ctx, p["task_id"], task, closing=False)


def apply_referee_vote(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """A referee's revealed (match, evidence) and the blinding of its commitment, in the slot's
    referee reveal window."""
    p = tx.payload
    task, slot = slot_of(state, tx)
    entry = _entry(slot, tx.sender, "referees", "referee")
    if entry["vote"] is not None:
        raise TxError(TxCode.ALREADY_KNOWN, "this referee already voted")
    if entry.get("commitment") is None or entry.get("unrevealed"):
        raise TxError(TxCode.BAD_STATE, "this referee has no sealed vote to reveal (referee_commit first)")
    if not slot.get("referee_reveal_deadline"):
        raise TxError(TxCode.BAD_STATE, "votes open once every referee of the slot has committed")
    if passed(slot["referee_reveal_deadline"], ctx):
        raise TxError(TxCode.BAD_STATE,
                      f"the vote reveal deadline (block time {slot['referee_reveal_deadline']} ms) has passed")
    if vote_commitment(p["task_id"], p["slot"], tx.sender, entry.get("panel", 0), p["match"], p["evidence"],
                       p["blinding"]) != entry["commitment"]:
        raise TxError(TxCode.BAD_PAYLOAD, "the vote does not match this referee's commitment")
    entry["vote"] = {"match": p["match"], "evidence": p["evidence"]}
    state.touch(TASK, p["task_id"])
    state.events.append({"type": "referee_voted", "task_id": p["task_id"], "slot": p["slot"],
                         "referee": tx.sender, "match": p["match"], "evidence": p["evidence"]})
    advance_task(state, params, ctx, p["task_id"], task, closing=False)

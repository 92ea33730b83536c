"""Equivocation evidence: a verified double vote or double proposal slashes the validator's stake,
once, and jails it (docs/adr/0165).

Evidence is ``consensus.messages.DoubleVoteEvidence`` or ``DoubleProposalEvidence`` bytes. One
offence is one (validator, height, round, vote type or "proposal"): further pairs for the same
step do not slash again. Evidence older than ``evidence_max_age`` blocks is refused.
"""
from __future__ import annotations

import hashlib

from consensus.genesis import Params
from consensus.messages import DoubleVoteEvidence, Evidence, MessageError, decode_evidence
from consensus.state.context import BlockContext
from consensus.state.staking import jail, slash
from consensus.state.store import EVIDENCE, LedgerState
from consensus.txcodes import TxCode, TxError

PROPOSAL_OFFENCE = 0xFF   # the "step" of a double proposal in its offence key (vote types are 1 and 2)


def offence_key(evidence: Evidence) -> bytes:
    if isinstance(evidence, DoubleVoteEvidence):
        vote = evidence.vote_a
        validator, height, round_, step = vote.validator, vote.height, vote.round, int(vote.type)
    else:
        validator, height, round_, step = evidence.validator, evidence.height, evidence.round, PROPOSAL_OFFENCE
    return hashlib.sha256(
        b"dekube/offence\x00" + validator.encode() + height.to_bytes(8, "big")
        + round_.to_bytes(4, "big") + bytes([step])
    ).digest()


def apply_evidence_bytes(state: LedgerState, params: Params, ctx: BlockContext, chain_id: str,
                         raw: bytes) -> int:
    """Check and apply one piece of evidence; returns the amount slashed (and burned)."""
    try:
        evidence = decode_evidence(raw)
    except (MessageError, ValueError) as exc:
        raise TxError(TxCode.INVALID_EVIDENCE, f"malformed evidence: {exc}") from None
    if not evidence.verify(chain_id):
        raise TxError(TxCode.INVALID_EVIDENCE, "not a validly signed double vote or proposal on this chain")
    if evidence.height >= ctx.height:
        raise TxError(TxCode.INVALID_EVIDENCE, "evidence from a height not yet committed")
    if evidence.height + params.evidence_max_age < ctx.height:
        raise TxError(TxCode.INVALID_EVIDENCE, "evidence is too old")
    key = offence_key(evidence)
    if key in state.evidence:
        raise TxError(TxCode.ALREADY_KNOWN, "this offence was already punished")
    stake = state.stakes.get(evidence.validator)
    if stake is None or stake.bonded + stake.unbonding_total == 0:
        raise TxError(TxCode.INVALID_EVIDENCE, "the offender has no stake")
    state.evidence[key] = ctx.height
    state.touch(EVIDENCE, key)
    amount = slash(state, evidence.validator, params.slash_double_sign_bps)
    state.events.append({"type": "validator_slashed", "validator": evidence.validator, "amount": amount,
                         "height": evidence.height})
    kind = "double vote" if isinstance(evidence, DoubleVoteEvidence) else "double proposal"
    jail(state, params, ctx.height, evidence.validator, f"{kind} at height {evidence.height}")
    return amount


def apply_evidence_tx(state: LedgerState, params: Params, ctx: BlockContext, tx) -> None:
    apply_evidence_bytes(state, params, ctx, tx.chain_id, tx.payload["evidence"])

"""Validator downtime (docs/adr/0165): a committee member that misses its proposer slots is jailed.

Each block's ``last_commit`` certifies the previous height and its votes carry the round that
decided it. The proposers of the earlier rounds of that height (``committee.proposer(h, r)`` for r
below the deciding round) missed their slot; the deciding round's proposer made it. A member's
``missed`` counts slots missed in a row; past ``downtime_max_missed`` it is slashed
``slash_downtime_bps`` and jailed. Proposer slots, not signatures, are counted because a
certificate holds the precommits that formed the quorum, not every precommit that was sent: a slow
but online validator is absent from many certificates, never from its own proposals for long.
"""
from __future__ import annotations

from consensus.certificate import CertificateError, decode_certificate
from consensus.committee import ValidatorSet
from consensus.genesis import Params
from consensus.state.context import BlockContext
from consensus.state.staking import jail, slash
from consensus.state.store import STAKE, LedgerState

MAX_ROUNDS_COUNTED = 64   # a height decided at a higher round still counts only this many slots


def record_proposer_slots(state: LedgerState, params: Params, ctx: BlockContext, last_commit: bytes) -> None:
    """Count the previous height's proposer slots (from ``last_commit``) against the committee."""
    previous = ctx.height - 1
    if params.downtime_max_missed == 0 or previous < max(1, state.committee_start) or not last_commit:
        return  # off, block 1, or the previous height belonged to the last epoch's committee
    try:
        votes = decode_certificate(last_commit)
    except CertificateError:
        return  # the committee checked it before committing; nothing to learn from junk
    if not votes:
        return
    decided = votes[0].round
    committee = ValidatorSet.of(state.committee, state.committee_start)
    missed_rounds = range(min(decided, MAX_ROUNDS_COUNTED))
    for r in missed_rounds:
        _missed(state, params, ctx, committee.proposer(previous, r))
    _made_it(state, committee.proposer(previous, decided))


def _missed(state: LedgerState, params: Params, ctx: BlockContext, peer_id: str) -> None:
    stake = state.stakes.get(peer_id)
    if stake is None or stake.jailed_until:
        return
    stake.missed += 1
    state.touch(STAKE, peer_id)
    if stake.missed > params.downtime_max_missed:
        slash(state, peer_id, params.slash_downtime_bps)
        jail(state, params, ctx.height, peer_id, f"missed {stake.missed} proposer slots in a row")


def _made_it(state: LedgerState, peer_id: str) -> None:
    stake = state.stakes.get(peer_id)
    if stake is not None and stake.missed:
        stake.missed = 0
        state.touch(STAKE, peer_id)

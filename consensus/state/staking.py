"""Staking: bond, unbond (released after the unbonding period), slashing, validator set.

Unbonding entries of a node still named in an open task or serving dispute are held past their
release height until it ends (consensus/state/obligations.py, ADR 0188): slashes reach them.

The committee (top ``committee_size`` candidates by bonded stake) is part of the replicated
state: elected from genesis for height 1 and again after every ``epoch_length``-th block, so
every replica, including one restarted mid-epoch, agrees on who decides each height. Slashing
takes a fraction of bonded plus unbonding stake (bonded first, then the newest
unbonding entries) and burns it; the burned total keeps the supply invariant checkable.
A jailed validator (double signing, downtime: docs/adr/0165) is no candidate at elections until it
sends ``unjail``, accepted ``jail_blocks`` after the offence.
"""
from __future__ import annotations

from consensus.committee import CommitteeError, ValidatorSet
from consensus.genesis import Params
from consensus.state.accounts import debit
from consensus.state.context import BlockContext
from consensus.state.obligations import held_by
from consensus.state.records import Stake
from consensus.state.store import STAKE, LedgerState
from consensus.tx import Tx
from consensus.txcodes import TxCode, TxError


def apply_bond(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    amount = tx.payload["amount"]
    debit(state, tx.sender, amount)
    state.stake(tx.sender).bonded += amount
    state.touch(STAKE, tx.sender)


def apply_unbond(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    amount = tx.payload["amount"]
    stake = state.stakes.get(tx.sender)
    bonded = stake.bonded if stake else 0
    if bonded < amount:
        raise TxError(TxCode.INSUFFICIENT_FUNDS, f"bonded stake {bonded} < {amount}")
    if stake is None:   # amounts are positive (the decoder's check): only a bonded sender gets here
        raise TxError(TxCode.INSUFFICIENT_FUNDS, "no bonded stake")
    release = ctx.height + params.unbonding_period
    stake.bonded -= amount
    stake.unbonding.append([release, amount])
    state.unbonding_queue.setdefault(release, set()).add(tx.sender)
    state.touch(STAKE, tx.sender)


def release_matured_unbonding(state: LedgerState, height: int) -> None:
    """Return every unbonding entry whose release height is ``height`` to its owner's balance; a node
    still held by an open task or dispute keeps its matured entries one more block (``hold``)."""
    peers = state.unbonding_queue.pop(height, ())
    for peer_id in sorted(peers):
        stake = state.stakes.get(peer_id)
        if stake is None:
            continue
        if held_by(state, peer_id):
            hold(state, peer_id, stake, height)
            continue
        keep = []
        for entry in stake.unbonding:
            if entry[0] <= height:
                state.credit(peer_id, entry[1])
            else:
                keep.append(entry)
        stake.unbonding = keep
        state.touch(STAKE, peer_id)


def hold(state: LedgerState, peer_id: str, stake: Stake, height: int) -> None:
    """Move ``peer_id``'s entries matured at ``height`` to ``height + 1`` (checked again then; the
    stake record shows the release height moving)."""
    for entry in stake.unbonding:
        if entry[0] <= height:
            entry[0] = height + 1
    state.unbonding_queue.setdefault(height + 1, set()).add(peer_id)
    state.touch(STAKE, peer_id)


def slash(state: LedgerState, peer_id: str, fraction_bps: int) -> int:
    """Burn ``fraction_bps`` of the peer's bonded + unbonding stake; returns the amount burned."""
    stake = state.stakes.get(peer_id)
    if stake is None:
        return 0
    amount = (stake.bonded + stake.unbonding_total) * fraction_bps // 10_000
    remaining = amount
    taken = min(stake.bonded, remaining)
    stake.bonded -= taken
    remaining -= taken
    for entry in reversed(stake.unbonding):
        taken = min(entry[1], remaining)
        entry[1] -= taken
        remaining -= taken
    stake.unbonding = [entry for entry in stake.unbonding if entry[1] > 0]
    stake.slashed += amount
    state.burned += amount
    state.touch(STAKE, peer_id)
    state.touch_meta()
    return amount


def jail(state: LedgerState, params: Params, height: int, peer_id: str, reason: str) -> bool:
    """Jail ``peer_id`` (no candidate from the next election on); False if it was already jailed."""
    stake = state.stakes.get(peer_id)
    if stake is None or stake.jailed_until:
        return False
    stake.jailed_until = height + params.jail_blocks
    stake.missed = 0
    state.touch(STAKE, peer_id)
    state.events.append({"type": "validator_jailed", "validator": peer_id, "reason": reason,
                         "until": stake.jailed_until})
    return True


def apply_unjail(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    stake = state.stakes.get(tx.sender)
    if stake is None or not stake.jailed_until:
        raise TxError(TxCode.BAD_STATE, "not jailed")
    if ctx.height < stake.jailed_until:
        raise TxError(TxCode.BAD_STATE, f"jailed until height {stake.jailed_until}")
    stake.jailed_until = 0
    state.touch(STAKE, tx.sender)
    state.events.append({"type": "validator_unjailed", "validator": tx.sender})


def validator_candidates(state: LedgerState, params: Params) -> list[tuple[str, int]]:
    """``(peer_id, bonded)`` of registered, unjailed validators with at least min_validator_stake,
    highest stake first (ties by peer ID). The committee is a prefix of this list."""
    out = []
    for peer_id, node in state.nodes.items():
        if "validator" not in node.roles:
            continue
        stake = state.stakes.get(peer_id)
        if stake is not None and not stake.jailed_until and stake.bonded >= params.min_validator_stake:
            out.append((peer_id, stake.bonded))
    out.sort(key=lambda item: (-item[1], item[0]))
    return out


def min_role_stake(params: Params) -> int:
    """The least bond any role needs to be paid: what makes a node "staked" for admission (ADR 0197)."""
    return min(params.min_validator_stake, params.min_worker_stake, params.min_verifier_stake,
               params.min_relay_stake, params.min_serve_stake)


def staked_peers(state: LedgerState, minimum: int, limit: int) -> list[tuple[str, int]]:
    """``(peer_id, bonded)`` of unjailed nodes with at least ``minimum`` bonded, highest stake first
    (ties by peer ID), at most ``limit``: the peers other nodes admit as ``STAKED`` (node/staked.py)."""
    out = [(peer_id, stake.bonded) for peer_id, stake in state.stakes.items()
           if stake.bonded >= minimum and not stake.jailed_until]
    out.sort(key=lambda item: (-item[1], item[0]))
    return out[:limit]


def elect_committee(state: LedgerState, params: Params, start_height: int) -> None:
    """Seat, at genesis, the committee for heights from ``start_height``."""
    state.committee = _elect(state, params, start_height) or state.committee
    state.committee_start = start_height
    state.touch_meta()


def elect_next_committee(state: LedgerState, params: Params, start_height: int) -> None:
    """Elect, one block before an epoch ends, the committee for heights from ``start_height``
    (``next_committee``, seated by ``seat_next_committee`` when the epoch ends). The app hash of this
    block commits to it, so the outgoing committee certifies its successor in the epoch's last block
    (docs/adr/0216). An election with no eligible validator re-elects the sitting committee (the
    chain would halt otherwise)."""
    state.next_committee = _elect(state, params, start_height) or [list(member) for member in state.committee]
    state.touch_meta()


def seat_next_committee(state: LedgerState, start_height: int) -> None:
    """At the end of an epoch: the committee elected a block earlier decides from ``start_height``."""
    if state.next_committee:
        state.committee, state.next_committee = state.next_committee, []
        state.committee_start = start_height
        state.touch_meta()


def _elect(state: LedgerState, params: Params, start_height: int) -> list[list]:
    try:
        elected = ValidatorSet.elect(dict(validator_candidates(state, params)), params.committee_size, start_height)
    except CommitteeError:
        return []
    return [[peer_id, power] for peer_id, power in elected.items()]

"""The supply invariant: balances + bonded + unbonding + task escrow + serving escrow + serving dispute bonds
+ burned == genesis supply."""
from __future__ import annotations

from consensus.state.store import LedgerState


class SupplyInvariantError(AssertionError):
    """Tokens were created or destroyed outside the ledger's rules."""


def supply_breakdown(state: LedgerState) -> dict[str, int]:
    return {
        "balances": sum(acct.balance for acct in state.accounts.values()),
        "bonded": sum(stake.bonded for stake in state.stakes.values()),
        "unbonding": sum(stake.unbonding_total for stake in state.stakes.values()),
        "escrow": sum(task.escrow for task in state.tasks.values()),
        "serve_escrow": sum(escrow.balance for escrow in state.serve_escrows.values()),
        "serve_dispute_bonds": sum(dispute.bond for dispute in state.serve_disputes.values()),
        "burned": state.burned,
    }


def check_supply(state: LedgerState, total_supply: int) -> None:
    """Raise SupplyInvariantError unless every token of ``total_supply`` is accounted for."""
    parts = supply_breakdown(state)
    if sum(parts.values()) != total_supply:
        raise SupplyInvariantError(f"supply {sum(parts.values())} != genesis supply {total_supply}: {parts}")
    negative = [name for name, value in parts.items() if value < 0]
    if negative or any(acct.balance < 0 for acct in state.accounts.values()):
        raise SupplyInvariantError(f"negative amounts in {negative or 'an account balance'}")

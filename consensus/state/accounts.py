"""Accounts: the ante check every transaction passes (nonce, fee, balance) and plain transfers.

Fees are paid to the block proposer (docs/adr/0021). A transaction that passes the ante
check always consumes its nonce and pays its fee, even if its payload then fails.
"""
from __future__ import annotations

from consensus.genesis import Params
from consensus.state.context import BlockContext
from consensus.state.store import ACCOUNT, LedgerState
from consensus.tx import Tx
from consensus.txcodes import TxCode, TxError


def check_nonce_and_fee(state: LedgerState, params: Params, tx: Tx) -> None:
    """Raise unless ``tx`` is the sender's next nonce and the sender can pay its fee."""
    acct = state.accounts.get(tx.sender)
    nonce = acct.nonce if acct else 0
    if tx.nonce < nonce:
        raise TxError(TxCode.NONCE_TOO_LOW, f"nonce {tx.nonce} < account nonce {nonce}")
    if tx.nonce > nonce:
        raise TxError(TxCode.NONCE_TOO_HIGH, f"nonce {tx.nonce} > account nonce {nonce}")
    if tx.fee < params.min_fee:
        raise TxError(TxCode.FEE_TOO_LOW, f"fee {tx.fee} < min_fee {params.min_fee}")
    check_can_pay(acct.balance if acct else 0, tx.fee)


def check_can_pay(balance: int, fee: int) -> None:
    """The balance rule (ADR 0135): the sender pays its fee from its balance, and an account holding
    nothing gets nothing committed, whatever min_fee is (no free records, no free nonces)."""
    if balance == 0:
        raise TxError(TxCode.INSUFFICIENT_FUNDS, "the sender's balance is 0: an empty account cannot transact")
    if balance < fee:
        raise TxError(TxCode.INSUFFICIENT_FUNDS, f"balance {balance} cannot pay fee {fee}")


def charge_fee_and_nonce(state: LedgerState, ctx: BlockContext, tx: Tx) -> None:
    acct = state.account(tx.sender)
    acct.balance -= tx.fee
    acct.nonce += 1
    state.touch(ACCOUNT, tx.sender)
    if tx.fee:
        state.credit(ctx.proposer, tx.fee)


def debit(state: LedgerState, peer_id: str, amount: int) -> None:
    """Take ``amount`` from ``peer_id`` or raise INSUFFICIENT_FUNDS (nothing changed then)."""
    acct = state.accounts.get(peer_id)
    balance = acct.balance if acct else 0
    if balance < amount:
        raise TxError(TxCode.INSUFFICIENT_FUNDS, f"balance {balance} < {amount}")
    if acct is None:   # nothing to take (amount 0) from an account that does not exist
        return
    acct.balance -= amount
    state.touch(ACCOUNT, peer_id)


def apply_transfer(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    payload = tx.payload
    debit(state, tx.sender, payload["amount"])
    state.credit(payload["to"], payload["amount"])

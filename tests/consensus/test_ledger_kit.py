"""Shared helpers for the ledger tests: deterministic identities and a one-node test chain
(devtools/ledger_chain.py, also used by the verification lab)."""
from consensus.genesis import Params
from devtools.ledger_chain import Chain as LabChain
from devtools.ledger_chain import ident  # noqa: F401  (re-exported for the ledger tests)

CHAIN = "dekube-test"


class Chain(LabChain):
    """The lab chain with the ledger tests' defaults: audits_per_worker=0, so tests of other task rules
    finalize without audit slots (test_audit_slots.py has them)."""

    def __init__(self, balances=None, validators=(0,), params=None, balance=1_000_000):
        params = params or Params(unbonding_period=3, task_timeout=12, audit_window=2, min_fee=0, audits_per_worker=0)
        super().__init__(balances, validators, params, balance, chain_id=CHAIN)


def test_kit_chain_starts_at_genesis():
    chain = Chain()
    assert chain.ledger.height == 0
    assert chain.ledger.balance(ident(1).peer_id) == 1_000_000
    chain.empty_blocks(2)
    assert chain.ledger.height == 2

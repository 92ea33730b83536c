"""Shared helpers for the ledger tests: deterministic identities and a one-node test chain
(devtools/ledger_chain.py, also used by the verification lab)."""
from devtools.ledger_chain import Chain, ident  # noqa: F401  (re-exported for the ledger tests)

CHAIN = "dekube-test"


def test_kit_chain_starts_at_genesis():
    chain = Chain()
    assert chain.ledger.height == 0
    assert chain.ledger.balance(ident(1).peer_id) == 1_000_000
    chain.empty_blocks(2)
    assert chain.ledger.height == 2

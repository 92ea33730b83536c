"""The chain invariant checker finds each kind of violation (fake RPC answers, no processes)."""
import copy

import pytest

from consensus.genesis import Genesis, GenesisValidator
from devtools import chaincheck
from node.identity import Identity

A, B, V = (Identity.from_seed(bytes([s]) * 32).peer_id for s in (1, 2, 3))
GENESIS = Genesis("check", 0, {A: 100, B: 100}, (GenesisValidator(V, 1000),))


def vote(h, value, validator=V, round_=0):
    return {"type": "precommit", "height": h, "round": round_, "value_id": value, "validator": validator,
            "signature": "00"}


def tx(h, sender, nonce):
    return {"hash": h, "from": sender, "nonce": nonce, "type": "transfer", "payload": {"to": B, "amount": 1}}


def good_chain():
    return [
        {"height": 1, "hash": "b1", "app_hash": "a1", "transactions": [tx("t1", A, 0)], "last_commit": [],
         "commit": [vote(1, "v1")]},
        {"height": 2, "hash": "b2", "app_hash": "a2", "transactions": [tx("t2", A, 1), tx("t3", B, 0)],
         "last_commit": [vote(1, "v1")], "commit": [vote(2, "v2")]},
    ]


class FakeNodes:
    def __init__(self, chains, balances=None, supply=None):
        self.chains = chains
        self.balances = balances or {A: 98, B: 102, V: 0}
        self.supply = supply or {"total": 1200, "burned": 0, "escrow": 0}
        self.nonces = {A: 2, B: 1}

    def call(self, url, method, *params, timeout=None):
        if method == "dkb_blockNumber":
            return len(self.chains[url])
        if method == "dkb_getTransactionCount":
            return self.nonces.get(params[0], 0)
        if method == "dkb_getSupply":
            return self.supply
        raise AssertionError(method)

    def batch(self, url, calls, timeout=None):
        out = []
        for method, params in calls:
            if method == "dkb_getBlockByNumber":
                out.append(self.chains[url][params[0] - 1])
            elif method == "dkb_getBalance":
                out.append(self.balances.get(params[0], 0))
            elif method == "dkb_getStake":
                out.append({"bonded": 1000 if params[0] == V else 0, "unbonding": [], "slashed": 0})
        return out


def run(monkeypatch, nodes, confirmed=frozenset({"t1", "t2"})):
    monkeypatch.setattr(chaincheck.jsonrpc, "call", nodes.call)
    monkeypatch.setattr(chaincheck.jsonrpc, "batch", nodes.batch)
    return chaincheck.check_chain(list(nodes.chains), GENESIS, set(confirmed))


def test_consistent_chains_pass(monkeypatch):
    assert run(monkeypatch, FakeNodes({"n1": good_chain(), "n2": good_chain()})) == []


@pytest.mark.parametrize("damage, expected", [
    (lambda c: c[1].update(app_hash="other"), "height 2"),
    (lambda c: c[1]["transactions"].append(tx("t1", A, 2)), "on chain 2 times"),
    (lambda c: c[1]["transactions"].__setitem__(0, tx("t2", A, 2)), "nonces on chain"),
    (lambda c: c[1]["commit"].append(vote(2, "v9")), "signed 2 different precommits"),
])
def test_each_violation_is_reported(monkeypatch, damage, expected):
    other = good_chain()
    damage(other)
    violations = run(monkeypatch, FakeNodes({"n1": other, "n2": good_chain()}))
    assert any(expected in v for v in violations), violations


def test_missing_confirmed_tx_and_supply_leaks_are_reported(monkeypatch):
    assert any("t9 is not on chain" in v for v in
               run(monkeypatch, FakeNodes({"n1": good_chain()}), confirmed={"t9"}))
    leaky = FakeNodes({"n1": good_chain()}, balances={A: 98, B: 103})
    assert any("accounts hold" in v for v in run(monkeypatch, leaky))
    minted = FakeNodes({"n1": good_chain()}, supply={"total": 1201, "burned": 0, "escrow": 0})
    assert any("genesis supply" in v for v in run(monkeypatch, copy.deepcopy(minted)))

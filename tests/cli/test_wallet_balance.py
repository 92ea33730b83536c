"""`wallet balance` shows free, bonded and unbonding tokens (unbonding stake was hidden: a user who
unbonded saw it vanish until it returned), against a stubbed JSON-RPC."""
import json

import pytest

from cli.main import main
from node.identity import Identity
from node.ledger import jsonrpc

ADDRESS = Identity.generate().peer_id
ANSWERS = {"dkb_getBalance": 1_000, "dkb_blockNumber": 42,
           "dkb_getStake": {"bonded": 500, "unbonding": [[60, 200], [75, 100]], "slashed": 0, "jailed_until": 0,
                            "missed": 0}}


@pytest.fixture(autouse=True)
def stub_rpc(monkeypatch):
    monkeypatch.setattr(jsonrpc, "call", lambda url, method, *params: ANSWERS[method])


def test_json_has_free_bonded_unbonding_and_total(capsys):
    assert main(["wallet", "balance", ADDRESS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["free"] == doc["balance"] == 1_000 and doc["bonded"] == 500 and doc["unbonding"] == 300
    assert doc["total"] == 1_800 and doc["unbonding_releases"] == [[60, 200], [75, 100]]


def test_text_names_each_part_and_when_unbonding_returns(capsys):
    assert main(["wallet", "balance", ADDRESS]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["free"].strip() == "1000" and lines["bonded"].strip() == "500"
    assert lines["unbonding"].strip() == "300 (200 at height 60, 100 at height 75)"
    assert lines["total"].strip() == "1800"

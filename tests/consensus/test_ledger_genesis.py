"""Genesis: validation, JSON round trip, stable hash, and the initial ledger state it produces."""
import pytest
from test_ledger_kit import ident

from consensus.genesis import Genesis, GenesisError, GenesisValidator, Params
from consensus.state.ledger import Ledger

A, B, V = ident(1).peer_id, ident(2).peer_id, ident(3).peer_id


def make(**overrides):
    args = dict(chain_id="dekube-local", genesis_time_ms=1_700_000_000_000, balances={A: 500, B: 0},
                validators=(GenesisValidator(V, 5_000, ("/ip4/127.0.0.1/tcp/26656",)),),
                params=Params(committee_size=4))
    args.update(overrides)
    return Genesis(**args)


def test_json_round_trip_and_stable_hash():
    genesis = make()
    again = Genesis.from_json(genesis.to_json())
    assert again == genesis and again.hash == genesis.hash
    assert make(balances={A: 501, B: 0}).hash != genesis.hash
    assert make(params=Params(committee_size=5)).hash != genesis.hash
    assert genesis.total_supply == 5_500


def test_initial_state_bonds_and_registers_validators():
    ledger = Ledger.from_genesis(make())
    assert ledger.balance(A) == 500 and ledger.balance(V) == 0
    assert ledger.stake_info(V)["bonded"] == 5_000
    assert ledger.validators() == [(V, 5_000)]
    assert ledger.node_info(V)["listen_addrs"] == ["/ip4/127.0.0.1/tcp/26656"]
    assert ledger.height == 0 and len(ledger.app_hash) == 32
    assert Ledger.from_genesis(make()).app_hash == ledger.app_hash
    ledger.check_invariants()


@pytest.mark.parametrize("overrides, error", [
    ({"chain_id": ""}, "chain_id"),
    ({"balances": {"nope": 1}}, "invalid peer ID"),
    ({"balances": {A: -1}}, "non-negative"),
    ({"validators": (GenesisValidator(V, 10),)}, "min_validator_stake"),
    ({"validators": (GenesisValidator(V, 5_000), GenesisValidator(V, 5_000))}, "duplicate"),
    ({"params": Params(committee_size=0)}, "committee_size"),
    ({"params": Params(verifier_share_bps=9_000, relay_share_bps=2_000)}, "bps"),
])
def test_invalid_genesis_is_refused(overrides, error):
    with pytest.raises(GenesisError, match=error):
        make(**overrides)


@pytest.mark.parametrize("text, error", [
    ("not json", "not JSON"),
    ('{"chain_id": "x"}', "malformed"),
    ('{"chain_id": "x", "genesis_time_ms": 0, "params": {"bogus": 1}}', "unknown params"),
])
def test_malformed_genesis_files(text, error):
    with pytest.raises(GenesisError, match=error):
        Genesis.from_json(text)

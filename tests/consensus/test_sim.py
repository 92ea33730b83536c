"""The deterministic simulator of real validators (devtools.consensus_sim): clean seeds, exact
replay, and planted bugs that it must report with the seed."""
import functools
import os
import subprocess
import sys

import pytest

import consensus.state.ledger as ledger_module
from consensus.driver import ConsensusDriver
from devtools.consensus_sim.__main__ import main
from devtools.consensus_sim.scenario import SimConfig, Simulation, simulate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIET = {"drop": 0.0, "duplicate": 0.0, "max_delay": 0.02, "partitions": False, "crashes": False,
         "torn_crashes": False, "byzantine": False}


@functools.cache
def run_seed(seed: int):
    return simulate(SimConfig(seed=seed))


@pytest.mark.parametrize("seed", range(12))
def test_seeds_run_clean_under_their_random_faults(seed):
    result = run_seed(seed)
    assert result.ok, (result.seed, result.violations)
    assert min(result.heights) >= 5
    assert result.commits > 0 and result.txs["accepted"] > 0


def test_the_seeds_together_exercise_every_fault():
    totals: dict[str, int] = {}
    for seed in range(12):
        result = run_seed(seed)
        for name, count in {**result.faults, **result.network}.items():
            totals[name] = totals.get(name, 0) + count
    for name in ("crash", "torn_crash", "partition", "restart", "evidence_seen",
                 "dropped", "duplicated", "partitioned", "double_votes"):
        assert totals[name] > 0, (name, totals)


def test_fault_free_run_commits_in_round_zero_with_transactions():
    result = simulate(SimConfig(seed=3, fault_time=5.0, tx_rate=20.0, **QUIET))
    assert result.ok, result.violations
    assert result.extra["max_round"] == 0
    assert min(result.heights) >= 20
    assert result.faults["crash"] == result.faults["torn_crash"] == 0


def test_double_voter_is_caught_and_slashed_on_chain():
    result = simulate(SimConfig(seed=7, byzantine=True, fault_time=6.0))
    assert result.ok, result.violations
    assert result.network["double_votes"] > 0 and result.faults["evidence_seen"] > 0
    assert result.byzantine_slashed > 0


def test_same_seed_same_trace():
    a, b = simulate(SimConfig(seed=42)), simulate(SimConfig(seed=42))
    assert (a.trace, a.heights, a.virtual_time, a.faults, a.network, a.txs) == \
           (b.trace, b.heights, b.virtual_time, b.faults, b.network, b.txs)
    assert simulate(SimConfig(seed=43)).trace != a.trace


def test_replay_is_exact_across_processes_and_hash_seeds():
    """A seed printed by one process replays in another (string hashing randomised differently)."""
    traces = []
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-m", "devtools.consensus_sim", "--seed", "5"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120, check=False,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": ROOT})
        assert out.returncode == 0, out.stdout + out.stderr
        traces.append([part for part in out.stdout.split() if part.startswith("trace=")])
    assert traces[0] == traces[1] and traces[0]


def test_planted_ledger_bug_on_one_replica_is_reported_with_the_seed(monkeypatch, capsys):
    """Replica 1's transfer credits one token too many: its app hash and supply diverge."""
    honest_transfer = ledger_module.HANDLERS["transfer"]
    current: dict = {}

    def buggy_transfer(state, params, ctx, tx):
        honest_transfer(state, params, ctx, tx)
        sim = current.get("sim")
        if sim is not None and sim.replicas[1].up and state is sim.replicas[1].ledger.state:
            state.credit(tx.payload["to"], 1)

    monkeypatch.setitem(ledger_module.HANDLERS, "transfer", buggy_transfer)
    original_init = Simulation.__init__

    def tracking_init(self, config):
        original_init(self, config)
        current["sim"] = self

    monkeypatch.setattr(Simulation, "__init__", tracking_init)
    assert main(["--seed", "2"]) == 1
    out = capsys.readouterr().out
    assert "seed=2 FAILED" in out
    assert "VIOLATION" in out and "STATE: node 1" in out and "SUPPLY: node 1" in out
    assert "replay: python -m devtools.consensus_sim --seed 2" in out


def test_planted_sync_bug_is_reported_as_lost_liveness(monkeypatch):
    """Peers that never serve block sync leave a crashed replica behind for good."""
    monkeypatch.setattr(ConsensusDriver, "_serve_sync", lambda self, peer, from_height: None)
    result = simulate(SimConfig(seed=9, liveness_bound=10.0))
    assert any(v.split(" ", 1)[1].startswith("LIVENESS") for v in result.violations), result.violations


def test_cli_runs_seeds_and_exits_zero(capsys):
    assert main(["--seeds", "2", "--first-seed", "20"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("seed=20 ok") and '"failures": []' in out[-1]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(int(os.environ.get("DEKUBE_SIM_SEEDS", "200"))))
def test_soak_many_seeds(seed):
    result = simulate(SimConfig(seed=1000 + seed))
    assert result.ok, (result.seed, result.violations)


def test_a_wiped_validator_rejoins_by_state_sync_when_peers_pruned_the_early_blocks():
    """docs/adr/0199: every replica keeps 100 blocks (epochs of 4), so block 1 is gone everywhere; at
    the heal replica 3 loses its disk, restores a snapshot from the others and then block-syncs and
    votes with the real driver, every later commit checked by the checker."""
    sim = Simulation(SimConfig(seed=5, fault_time=8.0, tx_rate=10.0, epoch_length=4, retain_blocks=100, wiped=3,
                               liveness_heights=8, **QUIET))
    result = sim.run()
    assert result.ok, result.violations
    assert result.faults["state_sync"] == 1
    wiped = sim.replicas[3]
    assert wiped.state_synced_to > 4 and wiped.store.storage.base == wiped.state_synced_to
    assert wiped.height >= wiped.state_synced_to + 8
    assert all(r.store.storage.base > 1 for r in sim.replicas)          # no one could serve block 1
    assert len({r.ledger.app_hash for r in sim.replicas if r.height == wiped.height}) == 1

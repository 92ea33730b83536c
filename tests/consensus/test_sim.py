"""Deterministic simulation of the real cores: safety, liveness, evidence and slashing, fairness."""
import os

import pytest

from consensus.simulator import SimConfig, Simulator, main, simulate


def test_fault_free_run_commits_every_height_in_round_zero():
    result = simulate(SimConfig(seed=0, heights=300, crashes=False, partitions=False, drop_rate=0.0))
    assert result.ok, result.violations
    assert result.heights == [300] * 5
    assert result.max_round == 0


@pytest.mark.parametrize("seed", range(8))
def test_safety_and_liveness_under_drops_partitions_crashes(seed):
    result = simulate(SimConfig(seed=seed, heights=200))
    assert result.ok, result.violations
    assert min(result.heights) == 200
    assert result.faults["crash"] > 0 or result.faults["partition"] > 0
    assert result.faults["dropped"] > 0


@pytest.mark.parametrize("seed", range(100, 105))
def test_double_voter_is_caught_slashed_and_voted_out(seed):
    result = simulate(SimConfig(seed=seed, heights=200, byzantine=True))
    assert result.ok, result.violations
    assert result.faults["double_votes"] > 0 and result.faults["double_proposals"] > 0
    assert result.evidence_on_chain > 0 and result.slashed_at is not None


def test_larger_committee_with_election_and_double_voter():
    result = simulate(SimConfig(seed=9, validators=10, committee_size=7, heights=120,
                                epoch_length=20, byzantine=True))
    assert result.ok, result.violations
    assert result.slashed_at is not None


def test_same_seed_replays_identically():
    a = simulate(SimConfig(seed=42, heights=120, byzantine=True))
    b = simulate(SimConfig(seed=42, heights=120, byzantine=True))
    assert (a.heights, a.virtual_time, a.faults, a.slashed_at, a.proposers) == \
           (b.heights, b.virtual_time, b.faults, b.slashed_at, b.proposers)


def test_proposers_rotate_in_proportion_to_stake():
    cfg = SimConfig(seed=3, heights=600, epoch_length=600, crashes=False, partitions=False,
                    drop_rate=0.0)
    sim = Simulator(cfg)
    result = sim.run()
    assert result.ok, result.violations
    committee = sim.nodes[0].app.validators(0)
    for peer_id, power in committee.items():
        expected = 600 * power / committee.total_power
        assert result.proposers[peer_id] == pytest.approx(expected, abs=3)
    outsider = sim.nodes[4].peer_id
    assert outsider not in committee and outsider not in result.proposers


def test_invariant_checker_flags_conflicting_commits():
    sim = Simulator(SimConfig(seed=1, heights=10))
    sim.committed[0] = b"\x00" * 32
    sim.app_hashes.clear()
    result = sim.run()
    assert any(v.startswith("SAFETY") for v in result.violations)


def test_invariant_checker_flags_missing_progress():
    result = simulate(SimConfig(seed=1, heights=50, max_virtual_time=1.0))
    assert any(v.startswith("LIVENESS") for v in result.violations)


def test_cli_exit_status(capsys):
    assert main(["--seeds", "1", "--heights", "30"]) == 0
    assert '"failures": 0' in capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(int(os.environ.get("DEKUBE_SIM_SEEDS", "20"))))
def test_soak_thousands_of_heights(seed):
    result = simulate(SimConfig(seed=1000 + seed, heights=3000, byzantine=seed % 2 == 0))
    assert result.ok, result.violations

"""The dispute game on the simulator (ADR 0170): a cheating worker, a false accuser, a rubber stamp, a
silent verifier and honest workers who dispute, on real replicas under the simulator's faults; the
invariants hold, the seeds together exercise every path, and a planted settlement bug is caught."""
import functools

import pytest

import consensus.state.audits as audits_module
from devtools.consensus_sim.scenario import SimConfig, simulate

SEEDS = range(8)


@functools.cache
def run_seed(seed: int):
    return simulate(SimConfig(seed=seed, dispute_game=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_dispute_game_holds_its_invariants_under_faults(seed):
    result = run_seed(seed)
    assert result.ok, (seed, result.violations)
    game = result.extra["game"]
    assert game["slot_guilty"] >= 1                       # the cheater is found guilty in every run
    assert sum(faults for faults in result.faults.values()) > 0 or result.network["dropped"] > 0


def test_the_seeds_together_exercise_every_party_and_path():
    totals: dict[str, int] = {}
    for seed in SEEDS:
        for name, count in run_seed(seed).extra["game"].items():
            totals[name] = totals.get(name, 0) + count
    for name in ("answers_false_accuser", "answers_rubber_stamp", "answers_honest", "answers_cheat",
                 "redraws", "referee_panels", "disputes", "honest_disputes", "slot_guilty", "slot_ok"):
        assert totals.get(name, 0) > 0, (name, totals)
    assert totals.get("answers_silent", 0) == 0


def test_same_seed_same_game():
    a, b = simulate(SimConfig(seed=4, dispute_game=True)), run_seed(4)
    assert (a.trace, a.extra["game"]) == (b.trace, b.extra["game"])


def test_a_settlement_that_never_slashes_false_answers_is_reported(monkeypatch):
    honest_settle = audits_module.settle

    def lenient(task, verifier_pool):
        out = honest_settle(task, verifier_pool)
        out.false_answers = []
        return out

    monkeypatch.setattr(audits_module, "settle", lenient)
    results = [simulate(SimConfig(seed=seed, dispute_game=True)) for seed in (0, 6)]
    violations = [v for r in results for v in r.violations]
    assert any("went unslashed" in v for v in violations), violations

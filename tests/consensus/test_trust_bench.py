"""The trust bench's adversaries at a tiny size (bench/verification.py, docs/adr/0208): the ledger
adversaries of devtools/trust_game.py and the lab's withholder and framers, each asserted against the
bench's targets (caught, honest slashed 0, cheater paid 0). The withholder (issue 24 item 3) meets them
since the availability challenge (ADR 0207); the framers (item 6) since receipts are signed by their
senders (ADR 0209): on the code before it, the framed worker was convicted."""
import pytest

from devtools.trust_game import GAMES, grinding_proposer
from devtools.verification_lab import Scenario, lab_spec, run_task

SEEDS = (1, 2)


@pytest.mark.parametrize("name", ["unbonder_worker", "unbonder_accuser", "profileless_task", "copier"])
def test_ledger_adversaries_are_caught_and_harm_nobody(name):
    for seed in SEEDS:
        out = GAMES[name](seed)
        assert out.engaged, f"{name} seed {seed}: the adversary never got to act"
        assert out.caught, f"{name} seed {seed}: not caught"
        assert out.honest_slashed == [] and not out.cheater_paid


def test_grinding_adds_nothing_to_what_the_audit_gives_on_this_seed():
    # a seed where a proposer that knows every future beacon finds no better draw than an honest one
    for seed in (1,):
        ground, honest = grinding_proposer(seed), grinding_proposer(seed, grinder=False)
        assert (ground.caught, ground.cheater_paid, ground.honest_slashed) == \
            (honest.caught, honest.cheater_paid, honest.honest_slashed) == (True, False, [])


def test_a_proposer_holding_every_slot_cannot_win_a_split_panel():
    # beyond ADR 0202's assumption (one validator: it knows each future beacon and picks, by block
    # times, at which height a deadline falls). Before ADR 0210, seed 2 gave the colluding verifier and
    # referee a 2-of-3 referee majority that slashed 3 honest parties; a split panel now grows until the
    # colluders are outvoted, and they are slashed
    for seed in (2, 3):
        ground = grinding_proposer(seed)
        assert ground.caught and ground.honest_slashed == [] and not ground.cheater_paid


SPEC = lab_spec(steps=40, segment_steps=10)


def test_a_withholder_is_not_paid_and_harms_nobody():
    result = run_task(Scenario("withholder", {1: "withhold"}), 1, SPEC)
    assert result.honest_slashed == []
    assert not result.cheater_paid()


def test_two_framers_cannot_convict_the_third_worker():
    result = run_task(Scenario("framers", {0: "frame", 1: "frame"}), 1, SPEC)
    victim = next(w for w in result.workers if w not in result.adversaries)
    assert result.honest_slashed == [] and result.paid.get(victim, 0) > 0
    assert victim not in result.guilty
    # the framers pay: their records hold receipts the victim never signed
    assert set(result.adversaries) <= set(result.guilty) and set(result.adversaries) <= set(result.slashed)
    assert not result.cheater_paid()

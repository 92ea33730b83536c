"""The verification protocol end to end in one process (devtools/verification_lab.py): the real ledger,
real training with per-segment records, and the node's own duty and judging code. Each adversary is
named and slashed alone; honest workers and verifiers are never slashed and the cheater's innocent
co-workers are paid."""
import pytest

from consensus.genesis import Params
from consensus.task_info import TaskDocError, TaskInfo
from devtools.verification_lab import LAB_PARAMS, Scenario, lab_spec, run_task
from ml.compute.duties import AUDIT, DISPUTE, REFEREE, duties_for

SPEC = lab_spec(steps=40, segment_steps=10)
ALWAYS_DOUBLE = Params(**{**LAB_PARAMS, "audit_double_bps": 10_000})


def check(result, adversary_caught=True):
    assert result.honest_slashed == []
    for worker in result.workers:
        if worker not in result.adversaries:
            assert result.paid.get(worker, 0) > 0, "an innocent worker went unpaid"
    if adversary_caught:
        assert result.adversaries and set(result.adversaries) <= set(result.slashed)


def test_honest_task_is_verified_and_everyone_paid():
    result = run_task(Scenario("honest"), 1, SPEC)
    assert result.slashed == [] and result.guilty == []
    assert set(result.outcomes) == {"ok"}
    check(result, adversary_caught=False)
    assert 0 < result.replayed_worker_steps < result.job_worker_steps


@pytest.mark.parametrize("mode", ["poison_zero", "poison_stealth", "lazy", "copycat", "partial:1"])
def test_cheating_worker_is_named_alone_and_slashed(mode):
    result = run_task(Scenario(mode, {1: mode}), 2, SPEC)
    assert result.guilty == result.adversaries
    check(result)


def test_false_accuser_is_slashed_and_the_accused_paid():
    result = run_task(Scenario("false_accuser", verifier_faults={0: "false_accuser"},
                               verifier_stakes={0: 50_000}), 3, SPEC)
    assert result.drawn_adversary_verifier and result.guilty == []
    check(result)


def test_rubber_stamp_is_caught_by_the_second_verifier():
    result = run_task(Scenario("rubber_stamp", verifier_faults={0: "rubber_stamp"},
                               verifier_stakes={0: 50_000}), 4, SPEC, ALWAYS_DOUBLE)
    assert result.drawn_adversary_verifier
    check(result)


def test_duties_follow_the_slot_state():
    slot = {"slot": 0, "worker": "w", "segment": 2, "salt": "ab" * 32, "outcome": "pending",
            "verifiers": [{"verifier": "v1", "deadline": 10, "answer": None},
                          {"verifier": "v2", "deadline": 10,
                           "answer": {"match": False, "evidence": "00" * 32, "step": 0}}],
            "dispute_deadline": 0, "dispute": None, "referees": [], "referee_deadline": 0}
    doc = {"task_id": "11" * 32, "slots": [slot]}
    task = TaskInfo.from_json(doc)
    assert [d.kind for d in duties_for(task, "v1", 5)] == [AUDIT]
    assert duties_for(task, "v1", 11) == []                    # past its deadline
    assert duties_for(task, "v2", 5) == [] and duties_for(task, "w", 5) == []   # no dispute window yet
    slot["dispute_deadline"] = 20
    task = TaskInfo.from_json(doc)
    assert [d.kind for d in duties_for(task, "w", 20)] == [DISPUTE]
    slot["dispute"] = {"height": 15}
    slot["referees"] = [{"referee": "r", "vote": None}]
    slot["referee_deadline"] = 30
    task = TaskInfo.from_json(doc)
    assert duties_for(task, "w", 16) == []
    assert [(d.kind, d.segment, d.salt) for d in duties_for(task, "r", 16)] == [(REFEREE, 2, bytes.fromhex("ab" * 32))]
    slot["outcome"] = "guilty"
    assert duties_for(TaskInfo.from_json(doc), "r", 16) == []
    for bad in ({"slot": "x"}, None, {"salt": "zz"}):   # a malformed slot: the decoder refuses the task
        with pytest.raises(TaskDocError):
            TaskInfo.from_json({"slots": [bad]})

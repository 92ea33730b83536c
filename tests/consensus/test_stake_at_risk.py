"""Trust round 2 on the ledger (issue 24, ADR 0188): stake stays while a node is at risk, unbonding
outlasts every window, stake to work scales with pay, and nodes without a profile neither work nor judge."""
import pytest
from test_audit_slots import (
    OWNER,
    PROFILE,
    SEGMENTS,
    SPEC,
    VERIFIERS,
    W1,
    W2,
    answer_rest_honestly,
    committed_task,
    hardware,
    make_chain,
    register,
    slashed,
    slots_of,
    submit,
)
from test_ledger_kit import answer_slot, ident, run_scheduled_draws

from consensus.genesis import Genesis, GenesisError, GenesisValidator, Params
from consensus.state.records import TaskStatus
from consensus.state.tasks import required_worker_stake
from consensus.tx import build_tx
from consensus.txcodes import TxCode, TxError

# Short windows so that a short unbonding period is valid: the hold, not the period, must catch the unbonder.
SHORT = dict(evidence_max_age=5, serve_dispute_window=4, serve_referee_s=1, dispute_blocks=1, audit_redraws=1,
             referee_rounds=1, unbonding_period=6)


def test_a_poisoner_that_unbonds_before_committing_is_still_slashed():
    chain = make_chain(**SHORT)
    task_id = submit(chain)
    stake = chain.ledger.stake_info(W2.peer_id)["bonded"]
    chain.ok(W2, "unbond", {"amount": stake})                      # leaves before committing its poison
    release = chain.ledger.stake_info(W2.peer_id)["unbonding"][0][0]
    for who in (W1, W2):
        chain.ok(who, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                        "result_hash": b"\x22" * 32, "segments": SEGMENTS})
    task = chain.ledger.state.tasks[task_id]
    run_scheduled_draws(chain, task_id)
    for slot in slots_of(task, W2):
        for v in slot["verifiers"]:
            answer_slot(chain, task_id, slot["slot"], v["verifier"], match=False, step=1)
    answer_rest_honestly(chain, task_id, task)
    while chain.ledger.height <= release + 3:                       # well past the release height
        chain.block()
    assert chain.ledger.stake_info(W2.peer_id)["unbonding"]        # held: the task is not final
    assert chain.ledger.balance(W2.peer_id) < 1_000_000 - stake + 1
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, W2) == stake * 1000 // 10_000             # was 0: the stake had left
    chain.empty_blocks(2)
    assert chain.ledger.stake_info(W2.peer_id)["unbonding"] == []  # released once the task is final
    assert chain.ledger.stake_info(W2.peer_id)["bonded"] == 0


def test_a_false_accuser_that_unbonds_after_answering_is_still_slashed():
    chain = make_chain(**SHORT)
    task_id, task, _ = committed_task(chain)
    slot = slots_of(task, W1)[0]
    accuser = slot["verifiers"][0]["verifier"]
    accuser_id = next(v for v in VERIFIERS if v.peer_id == accuser) if accuser not in (W1.peer_id, W2.peer_id) \
        else (W1 if accuser == W1.peer_id else W2)
    answer_slot(chain, task_id, slot["slot"], accuser, match=False, step=2, evidence=b"\xf0" * 32)
    chain.ok(W1, "dispute", {"task_id": task_id, "slot": slot["slot"]})
    run_scheduled_draws(chain, task_id)
    bonded = chain.ledger.stake_info(accuser)["bonded"]
    unbond = chain.tx(accuser_id, "unbond", {"amount": bonded})     # leaves as the referees vote
    chain.block([unbond] + [chain.seal_vote(next(i for i in [*VERIFIERS, W1, W2] if i.peer_id == r["referee"]),
                                            task_id, slot["slot"], True, b"\xe0" * 32) for r in slot["referees"]])
    chain.reveal_all(task_id)
    assert slot["outcome"] == "ok"
    answer_rest_honestly(chain, task_id, task)
    chain.empty_blocks(SHORT["unbonding_period"] + 2)
    assert chain.ledger.stake_info(accuser)["unbonding"]           # held until finalize
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, accuser) == bonded * 1000 // 10_000


def test_unbonding_must_outlast_every_window():
    validators = (GenesisValidator(ident(0).peer_id, 10_000),)
    with pytest.raises(GenesisError, match="unbonding_period"):
        Genesis("c", 0, {}, validators, Params(unbonding_period=20))          # the old default
    with pytest.raises(GenesisError, match="serve_dispute_window"):
        Params(unbonding_period=200, evidence_max_age=10, serve_dispute_window=300).validate()
    Genesis("c", 0, {}, validators, Params())
    assert Params().unbonding_period > max(Params().evidence_max_age, Params().serve_dispute_window)


def test_stake_to_work_scales_with_the_pay():
    chain = make_chain(stake_cover_bps=20_000)                 # workers bonded 3,000 and 2,500
    task = chain.ledger.state.tasks[submit(chain)]             # pays 4,250 each: needs 42,500 bonded
    assert required_worker_stake(chain.params, task) == 42_500
    assert task.status == TaskStatus.CREATED
    small = chain.ledger.state.tasks[submit(chain, price=500)]     # pays 212: needs 2,120
    assert small.status == TaskStatus.ASSIGNED and sorted(small.workers) == sorted([W1.peer_id, W2.peer_id])
    for who in (W1, W2):
        chain.ok(who, "bond", {"amount": 40_000})
    assert task.status == TaskStatus.CREATED                   # its workers are busy with the small one


def test_nodes_without_a_profile_get_no_work_and_judge_nothing():
    chain = make_chain()
    natives = [ident(11), ident(12), ident(13)]                # native kernels: no profile published
    for who in natives:
        register(chain, who, "compute", 50_000, profiles=())
    with pytest.raises(TxError) as err:                        # a raw client leaving the profile out
        build_tx(OWNER, "dekube-test", 0, "submit_task", {**SPEC, "segments": SEGMENTS})
    assert err.value.code == TxCode.BAD_PAYLOAD
    task_id, task, _ = committed_task(chain)
    native_ids = {who.peer_id for who in natives}
    assert not native_ids & set(task.workers)
    judges = {v["verifier"] for s in task.slots for v in s["verifiers"]}
    assert judges and not native_ids & judges
    assert hardware()["profiles"] == [PROFILE]

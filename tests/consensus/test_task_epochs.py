"""A task cut into epochs (docs/adr/0203, issue 23 item 2): every member commits its progress at each
epoch end (commit_epoch), each epoch has its own deadline, a worker that stops committing leaves the
crew and is paid only for the epochs it committed (when they are audited ok), a crew that stops in the
middle is caught at that epoch's deadline and the task pays its closed epochs and refunds the rest, and
the epoch layout fixed at submit is checked at every commitment. Every test here fails on the code
before ADR 0203 (no ``epochs`` field, no ``commit_epoch`` transaction)."""
import pytest
from test_ledger_kit import CHAIN, answer_all_slots, answer_slot, crew_chain, ident, run_scheduled_draws, run_until

from consensus.block import build_block
from consensus.genesis import Params
from consensus.state.deadlines import commit_span_ms
from consensus.state.epoch_pay import part
from consensus.state.epochs import unavailable_evidence
from consensus.state.ledger import Ledger
from consensus.state.records import TaskStatus
from consensus.state.store import LedgerState
from consensus.state.tasks import task_id_for, worker_share
from consensus.txcodes import TxCode

OWNER, W1, W2, W3, VERIFIER, OUTSIDER = (ident(i) for i in range(1, 7))
PRICE = 9_000
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
EPOCHS, SEGMENTS, EXPECTED_S = 3, 6, 30
SPEC = {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 60}, "workers": 3,
        "sync_mode": "allreduce", "codec": "int8", "profile": PROFILE, "segments": SEGMENTS,
        "expected_s": EXPECTED_S, "epochs": EPOCHS}
EPOCH_S = EXPECTED_S // EPOCHS * 4          # one epoch's work x deadline_factor_pct 400, no slack: 40 s
GRACE_S = EPOCH_S // 4
HARDWARE = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100, "profiles": [PROFILE]}
ROOT, STATE, RESULT = b"\x11" * 32, b"\x33" * 32, b"\x22" * 32


@pytest.fixture
def chain():
    return crew_chain((W1, W2, W3), VERIFIER, HARDWARE)


def submit(chain, **changes) -> bytes:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**SPEC, "price": PRICE, **changes})
    return task_id_for(OWNER.peer_id, nonce)


def commit_epoch(chain, who, task_id, epoch, segments=None):
    return chain.run(who, "commit_epoch", {"task_id": task_id, "epoch": epoch, "segments_root": ROOT,
                                           "state_digest": STATE,
                                           "segments": (epoch + 1) * 2 if segments is None else segments})


def commit_result(chain, who, task_id):
    return chain.run(who, "commit_result", {"task_id": task_id, "segments_root": ROOT, "result_hash": RESULT,
                                            "segments": SEGMENTS})


def all_commit_epoch(chain, task_id, epoch, workers=(W1, W2, W3)):
    result = chain.block([chain.tx(w, "commit_epoch", {"task_id": task_id, "epoch": epoch, "segments_root": ROOT,
                                                       "state_digest": STATE, "segments": (epoch + 1) * 2})
                          for w in workers])
    assert all(r.code == TxCode.OK for r in result.receipts), result.receipts
    return result


def block_time_ms(chain) -> int:
    return chain.ledger.state.last_block_time_ms


def share() -> int:
    return worker_share(Params(), PRICE, 3)


def expected_payouts(task, workers: dict) -> dict:
    """``workers`` (peer -> pay) plus each epoch's part of the verifier pool split over its slots answered in
    agreement with their verdict (one verifier a slot here), the owner the rest."""
    out = dict(workers)
    count = task.spec.get("epochs", 1)
    for epoch in range(count):   # each epoch's part of the pool over its slots (docs/adr/0230)
        paid_slots = [slot for slot in task.slots if slot["outcome"] in ("ok", "guilty") and slot["epoch"] == epoch]
        for slot in paid_slots:
            verifier = slot["verifiers"][0]["verifier"]
            out[verifier] = out.get(verifier, 0) + part(PRICE * 500 // 10_000, epoch, count) // len(paid_slots)
    out[OWNER.peer_id] = PRICE - sum(out.values())
    return out


def test_each_epoch_closes_when_the_crew_committed_it_with_its_own_deadline(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    assert task.spec["epochs"] == EPOCHS and task.epochs == {"current": 0, "commits": {}}
    assert task.commit_deadline == block_time_ms(chain) + EPOCH_S * 1000   # the first epoch's, not the task's
    result = all_commit_epoch(chain, task_id, 0)
    closed = next(e for e in result.events if e["type"] == "epoch_closed")
    assert closed["epoch"] == 0 and closed["committed"] == task.workers and closed["departed"] == []
    assert task.epochs["current"] == 1 and task.status == TaskStatus.RUNNING
    assert task.commit_deadline == block_time_ms(chain) + EPOCH_S * 1000   # renewed at the close
    all_commit_epoch(chain, task_id, 1)
    assert task.epochs["current"] == 2
    assert [entry[2] for entry in task.epochs["commits"][W1.peer_id]] == [2, 4]
    for worker in (W1, W2, W3):
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    assert task.status == TaskStatus.COMMITTED
    run_scheduled_draws(chain, task_id)   # draws wait for a later beacon (ADR 0202)
    assert all(0 <= slot["segment"] < SEGMENTS for slot in task.slots)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID
    assert task.payouts == expected_payouts(task, {w.peer_id: share() for w in (W1, W2, W3)})   # full shares
    doc = chain.ledger.task_info(task_id)
    assert doc["epochs"]["current"] == 2 and doc["spec"]["epochs"] == EPOCHS


def test_a_worker_that_leaves_in_epoch_2_is_paid_for_epoch_1_only(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    before = {w.peer_id: chain.ledger.balance(w.peer_id) for w in (OWNER, W1, W2, W3, VERIFIER)}
    all_commit_epoch(chain, task_id, 0)
    assert commit_epoch(chain, W1, task_id, 1).code == TxCode.OK
    assert commit_epoch(chain, W2, task_id, 1).code == TxCode.OK       # a quorum: the grace starts
    assert task.commit_deadline == block_time_ms(chain) + GRACE_S * 1000
    run_until(chain, lambda: task.epochs["current"] == 2)               # W3 never commits epoch 1
    assert commit_epoch(chain, W3, task_id, 1).code == TxCode.BAD_STATE   # it left the crew
    assert commit_result(chain, W3, task_id).code == TxCode.BAD_STATE
    assert commit_result(chain, W1, task_id).code == TxCode.OK
    assert task.status == TaskStatus.RUNNING
    assert commit_result(chain, W2, task_id).code == TxCode.OK
    assert task.status == TaskStatus.COMMITTED      # nobody left to wait for: the leaver is no blocker
    assert task.commits[W3.peer_id][2] == 2          # held to its epoch-1 commitment
    run_scheduled_draws(chain, task_id)   # draws wait for a later beacon (ADR 0202)
    w3_slots = [slot for slot in task.slots if slot["worker"] == W3.peer_id]
    assert w3_slots and all(slot["segment"] < 2 for slot in w3_slots)   # audits draw from what it committed
    answer_all_slots(chain, task_id)
    chain.block()   # epochs 1 and 2 were audited as they closed and are paid out before finalize (ADR 0230)
    assert task.epochs["released"] == [0, 1] and task.epochs["earned"][W3.peer_id] == share() // EPOCHS
    assert chain.ledger.balance(W3.peer_id) - before[W3.peer_id] >= share() // EPOCHS
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID and task.result == RESULT
    expected = expected_payouts(task, {W1.peer_id: share(), W2.peer_id: share(), W3.peer_id: share() // EPOCHS})
    assert task.payouts == expected
    for peer_id, amount in expected.items():
        assert chain.ledger.balance(peer_id) - before[peer_id] == amount


def test_a_crew_that_stops_is_caught_within_one_epoch_pays_closed_epochs_and_refunds_the_rest(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    assigned_ms = block_time_ms(chain)
    all_commit_epoch(chain, task_id, 0)
    assert commit_epoch(chain, W1, task_id, 1).code == TxCode.OK   # below quorum: the others died
    epoch_deadline = task.commit_deadline
    run_until(chain, lambda: task.status != TaskStatus.RUNNING)
    assert block_time_ms(chain) == epoch_deadline                 # caught at the epoch's deadline ...
    assert epoch_deadline < assigned_ms + commit_span_ms(chain.params, EXPECTED_S)   # ... not the task's
    assert task.status == TaskStatus.COMMITTED and task.epochs["stopped"] == 1
    assert "stopped committing in epoch 2 of 3" in task.reason
    assert {w: c[2] for w, c in task.commits.items()} == {w.peer_id: 2 for w in (W1, W2, W3)}
    run_scheduled_draws(chain, task_id)   # draws wait for a later beacon (ADR 0202)
    assert all(slot["segment"] < 2 for slot in task.slots)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.STOPPED and "stopped" in task.reason   # not "paid" (ADR 0211)
    assert task.result == b""                    # epoch states, not trained weights: nothing to fetch as one
    expected = expected_payouts(task, {w.peer_id: share() // EPOCHS for w in (W1, W2, W3)})
    assert task.payouts == expected and task.escrow == 0
    assert expected[OWNER.peer_id] > 2 * share()                  # two epochs of three workers refunded


def test_a_crew_that_never_commits_an_epoch_expires_refunded(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    run_until(chain, lambda: task.status != TaskStatus.ASSIGNED)
    assert task.status == TaskStatus.EXPIRED and task.payouts == {OWNER.peer_id: PRICE}


def test_the_epoch_layout_is_fixed_by_the_spec_and_checked_at_commit(chain):
    assert chain.run(OWNER, "submit_task", {**SPEC, "price": PRICE, "epochs": 4}).code == TxCode.BAD_PAYLOAD
    no_expected = {k: v for k, v in SPEC.items() if k != "expected_s"}
    assert chain.run(OWNER, "submit_task", {**no_expected, "price": PRICE}).code == TxCode.BAD_PAYLOAD
    task_id = submit(chain)
    assert commit_epoch(chain, W1, task_id, 0, segments=3).code == TxCode.BAD_PAYLOAD   # not the layout's
    assert commit_epoch(chain, W1, task_id, 0, segments=6).code == TxCode.BAD_PAYLOAD
    assert commit_epoch(chain, W1, task_id, 1).code == TxCode.BAD_STATE                  # epoch 0 first
    assert commit_epoch(chain, W1, task_id, 2, segments=6).code == TxCode.BAD_PAYLOAD    # the last: a result
    assert commit_result(chain, W1, task_id).code == TxCode.BAD_STATE                    # progress first
    assert commit_epoch(chain, OUTSIDER, task_id, 0).code == TxCode.UNAUTHORIZED
    assert commit_epoch(chain, W1, task_id, 0).code == TxCode.OK
    assert commit_epoch(chain, W1, task_id, 0).code == TxCode.ALREADY_KNOWN
    plain = submit(chain, epochs=1)
    assert chain.ledger.state.tasks[plain].epochs == {}
    assert commit_epoch(chain, W1, plain, 0).code in (TxCode.BAD_STATE, TxCode.UNAUTHORIZED)


def test_a_leaver_its_verifiers_cannot_reach_is_unaudited_not_slashed(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    all_commit_epoch(chain, task_id, 1, workers=(W1, W2))
    run_until(chain, lambda: task.epochs["current"] == 2)
    commit_result(chain, W1, task_id)
    commit_result(chain, W2, task_id)
    bonded = chain.ledger.state.stakes[W3.peer_id].bonded
    run_scheduled_draws(chain, task_id)   # draws wait for a later beacon (ADR 0202)
    for slot in task.slots:
        if slot["worker"] == W3.peer_id:   # the leaver's node is gone: every judge says "unreachable"
            answer_slot(chain, task_id, slot["slot"], slot["verifiers"][0]["verifier"], match=False,
                        evidence=unavailable_evidence(slot["salt"]), step=1)
            assert slot["outcome"] == "unaudited" and slot["dispute_deadline"] == 0
        else:
            answer_slot(chain, task_id, slot["slot"], slot["verifiers"][0]["verifier"])
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID
    # no worker pay (its audits are unaudited); only what it earned where the draw made it a verifier
    assert task.payouts.get(W3.peer_id, 0) == expected_payouts(task, {}).get(W3.peer_id, 0)
    assert chain.ledger.state.stakes[W3.peer_id].bonded == bonded


def test_a_full_committer_that_is_unreachable_is_challenged(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    all_commit_epoch(chain, task_id, 1)
    for worker in (W1, W2, W3):
        commit_result(chain, worker, task_id)
    run_scheduled_draws(chain, task_id)   # draws wait for a later beacon (ADR 0202)
    slot = task.slots[0]
    answer_slot(chain, task_id, 0, slot["verifiers"][0]["verifier"], match=False,
                evidence=unavailable_evidence(slot["salt"]), step=1)
    # withholding a full result is a question for the worker (ADR 0207), no mismatch it could dispute
    assert slot["outcome"] == "pending" and slot["challenge"]["deadline"] and not slot["dispute_deadline"]


def test_a_restarted_replica_closes_epochs_and_stops_the_task_with_the_same_app_hash(chain):
    task_id = submit(chain)
    all_commit_epoch(chain, task_id, 0)
    commit_epoch(chain, W1, task_id, 1)
    replica = Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items()))   # restart from storage
    task = chain.ledger.state.tasks[task_id]
    assert replica.state.tasks[task_id] == task and task.epochs["commits"]
    while task.status == TaskStatus.RUNNING:
        led = chain.ledger
        block = build_block(CHAIN, led.height + 1, 1000 * (led.height + 1), led.last_block_hash, led.app_hash,
                            chain.proposer_identity, led.beacon, [], ())
        results = [led.apply_block(block), replica.apply_block(block)]
        assert results[0].app_hash == results[1].app_hash and results[0].events == results[1].events
    assert replica.state.tasks[task_id] == task and task.epochs["stopped"] == 1
    assert replica.full_state_hash() == chain.ledger.full_state_hash()


def test_a_rejection_after_the_others_committed_closes_the_epoch_and_progress_cannot_be_rejected(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0, workers=(W1, W2))
    assert task.epochs["current"] == 0                      # W3 may still commit
    assert chain.run(W1, "reject_task", {"task_id": task_id, "reason": "late"}).code == TxCode.BAD_STATE
    assert chain.run(W3, "reject_task", {"task_id": task_id, "reason": "dry run failed"}).code == TxCode.OK
    assert task.epochs["current"] == 1                      # nobody left to wait for


def test_a_lone_worker_that_runs_ahead_of_a_crew_that_never_closed_an_epoch_is_not_paid(chain):
    task_id = submit(chain, epochs=2)
    task = chain.ledger.state.tasks[task_id]
    assert commit_epoch(chain, W1, task_id, 0, segments=3).code == TxCode.OK
    assert commit_result(chain, W1, task_id).code == TxCode.OK      # ahead of epoch 0's close
    run_until(chain, lambda: task.status != TaskStatus.RUNNING)
    assert task.status == TaskStatus.EXPIRED and task.payouts == {OWNER.peer_id: PRICE}

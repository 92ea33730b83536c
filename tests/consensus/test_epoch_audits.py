"""Audits drawn per epoch and escrow paid out per epoch (docs/adr/0230, issue 23 item 2): when an epoch of a
task closes, each worker that committed it gets its audit slots among that epoch's segments, under that
epoch's commitment; once the slots are resolved the epoch's part of each seat's share and of the verifier
pool is paid out while the crew trains on, in epoch order. A worker found guilty is slashed at once, paid
nothing more and leaves the crew (its seat goes to a joiner); an epoch's worker that withholds its record is
guilty if it commits again and unaudited if it left. Every test here fails on the code before ADR 0230
(slots were drawn only when the commit phase closed, and everything was paid at finalize)."""
import pytest
from test_ledger_kit import answer_all_slots, answer_slot, crew_chain, run_scheduled_draws, run_until
from test_task_crew import SPARE, spare_chain
from test_task_epochs import (
    EPOCHS,
    HARDWARE,
    OUTSIDER,
    OWNER,
    PRICE,
    VERIFIER,
    W1,
    W2,
    W3,
    all_commit_epoch,
    commit_epoch,
    commit_result,
    share,
    submit,
)

from consensus.state.epoch_pay import part
from consensus.state.epochs import unavailable_evidence
from consensus.state.records import TaskStatus
from consensus.state.supply import supply_breakdown
from consensus.txcodes import TxCode

CREW = (W1, W2, W3)


@pytest.fixture
def chain():
    return spare_chain()


LONG_S = 600   # epochs of 200 s of declared work: no epoch deadline passes while slots are judged


def total(chain) -> int:
    return sum(supply_breakdown(chain.ledger.state).values())


def epoch_slots(task, epoch):
    return [slot for slot in task.slots if slot["epoch"] == epoch]


def test_an_epoch_is_audited_when_it_closes_and_paid_out_while_the_crew_trains_on(chain):
    supply = total(chain)
    task_id = submit(chain, expected_s=LONG_S)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    assert [slot["worker"] for slot in task.slots] == sorted(w.peer_id for w in CREW)   # one slot each, epoch 0
    run_scheduled_draws(chain, task_id)
    assert all(slot["epoch"] == 0 and 0 <= slot["segment"] < 2 for slot in task.slots)   # that epoch's segments
    assert all(slot["commit"]["segments"] == 2 for slot in task.slots)                     # under its commitment
    earned_before = {w.peer_id: chain.ledger.balance(w.peer_id) for w in CREW}
    answer_all_slots(chain, task_id)
    chain.block()
    assert task.status == TaskStatus.RUNNING and task.epochs["released"] == [0]   # paid out mid-run
    assert task.epochs["earned"] == {w.peer_id: part(share(), 0, EPOCHS) for w in CREW}
    for worker in CREW:
        assert chain.ledger.balance(worker.peer_id) - earned_before[worker.peer_id] >= share() // EPOCHS
    assert task.escrow < PRICE - EPOCHS * (share() // EPOCHS) + share()
    all_commit_epoch(chain, task_id, 1)
    run_scheduled_draws(chain, task_id)
    assert all(2 <= slot["segment"] < 4 for slot in epoch_slots(task, 1))
    answer_all_slots(chain, task_id)
    chain.block()
    assert task.epochs["released"] == [0, 1] and task.status == TaskStatus.RUNNING
    for worker in CREW:
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    run_scheduled_draws(chain, task_id)
    assert all(4 <= slot["segment"] < 6 for slot in epoch_slots(task, 2))   # the last epoch's, at commit close
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID and task.epochs["released"] == [0, 1, 2] and task.escrow == 0
    assert task.epochs["earned"] == {w.peer_id: share() for w in CREW}   # the epochs' parts add up to the share
    assert total(chain) == supply


def test_a_worker_found_guilty_in_an_epoch_is_slashed_at_once_paid_nothing_more_and_replaced(chain):
    supply = total(chain)
    task_id = submit(chain, expected_s=LONG_S, epochs=6)   # one segment an epoch
    task = chain.ledger.state.tasks[task_id]
    for worker in CREW:
        assert commit_epoch(chain, worker, task_id, 0, segments=1).code == TxCode.OK
    run_scheduled_draws(chain, task_id)
    cheat = next(slot for slot in task.slots if slot["worker"] == W1.peer_id)
    for slot in task.slots:
        honest = slot is not cheat
        answer_slot(chain, task_id, slot["slot"], slot["verifiers"][0]["verifier"], match=honest,
                    evidence=b"\xe0" * 32 if honest else b"\x0b" * 32, step=0 if honest else 1)
    bonded = chain.ledger.state.stakes[W1.peer_id].bonded
    run_until(chain, lambda: cheat["outcome"] == "guilty")   # W1 does not dispute
    chain.block()
    assert task.status == TaskStatus.RUNNING and task.epochs["released"] == [0]
    slashed = chain.ledger.state.stakes[W1.peer_id].bonded
    assert slashed < bonded and task.epochs["slashed"] == [W1.peer_id]
    assert W1.peer_id not in task.epochs["earned"] and W2.peer_id in task.epochs["earned"]
    # its seat goes to the spare at once, one past the furthest commitment (epoch 0): from epoch 2 on
    assert task.epochs["joined"] == {SPARE.peer_id: [task.workers.index(W1.peer_id), 2]}
    assert task.epochs["current"] == 1
    assert commit_epoch(chain, W1, task_id, 1, segments=2).code == TxCode.BAD_STATE   # out of the crew
    for worker in (W2, W3):
        assert commit_epoch(chain, worker, task_id, 1, segments=2).code == TxCode.OK   # closes without it
    assert task.epochs["current"] == 2
    for epoch in (2, 3, 4):
        for worker in (W2, W3, SPARE):
            assert commit_epoch(chain, worker, task_id, epoch, segments=epoch + 1).code == TxCode.OK
    for worker in (W2, W3, SPARE):
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    run_scheduled_draws(chain, task_id)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID
    assert chain.ledger.state.stakes[W1.peer_id].bonded == slashed   # slashed once
    assert task.epochs["slashed"] == [W1.peer_id] and W1.peer_id not in task.epochs["earned"]
    assert task.epochs["earned"][SPARE.peer_id] == sum(part(share(), e, 6) for e in (2, 3, 4, 5))
    assert total(chain) == supply


def _withhold(chain, task_id):
    """Epoch 0 closes; every verifier of W1's slot says its record is unreachable: the slot is challenged,
    and W1 never answers the challenge."""
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    run_scheduled_draws(chain, task_id)
    slot = next(slot for slot in task.slots if slot["worker"] == W1.peer_id)
    for other in task.slots:
        if other is not slot:
            answer_slot(chain, task_id, other["slot"], other["verifiers"][0]["verifier"])
    answer_slot(chain, task_id, slot["slot"], slot["verifiers"][0]["verifier"], match=False,
                evidence=unavailable_evidence(slot["salt"]), step=1)
    assert slot["challenge"]["deadline"]
    run_until(chain, lambda: chain.ledger.state.last_block_time_ms > slot["challenge"]["deadline"] + 1000)
    return task, slot


def test_an_epoch_record_withheld_by_a_worker_that_commits_on_is_guilty(chain):
    task_id = submit(chain, expected_s=LONG_S)
    task, slot = _withhold(chain, task_id)
    assert slot["outcome"] == "pending"   # silent: alive and withholding, or gone? the ledger waits
    assert task.epochs.get("released", []) == []
    bonded = chain.ledger.state.stakes[W1.peer_id].bonded
    assert commit_epoch(chain, W1, task_id, 1).code == TxCode.OK   # alive: it was withholding
    chain.block()
    assert slot["outcome"] == "guilty" and slot["verdict"]["withheld"]
    chain.block()
    assert chain.ledger.state.stakes[W1.peer_id].bonded < bonded and task.epochs["released"] == [0]


def test_an_epoch_record_of_a_worker_that_left_the_crew_is_unaudited_not_slashed(chain):
    task_id = submit(chain, expected_s=LONG_S)
    task, slot = _withhold(chain, task_id)
    bonded = chain.ledger.state.stakes[W1.peer_id].bonded
    all_commit_epoch(chain, task_id, 1, workers=(W2, W3))
    run_until(chain, lambda: task.epochs["current"] == 2, limit=3000)   # W1 missed epoch 1: it left (crashed)
    chain.block()
    assert slot["outcome"] == "unaudited"
    assert chain.ledger.state.stakes[W1.peer_id].bonded == bonded and W1.peer_id not in task.epochs["earned"]


def test_epochs_are_paid_out_in_order(chain):
    """A slot of epoch 0 still open (disputed) holds back the pay of epoch 1, whose slots resolved: a verdict
    in an earlier epoch counts before a later epoch pays."""
    task_id = submit(chain, expected_s=LONG_S)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    run_scheduled_draws(chain, task_id)
    held = task.slots[0]
    for slot in task.slots[1:]:
        answer_slot(chain, task_id, slot["slot"], slot["verifiers"][0]["verifier"])
    all_commit_epoch(chain, task_id, 1)
    run_scheduled_draws(chain, task_id)
    for slot in epoch_slots(task, 1):   # epoch 1's slots ok; epoch 0's first slot still unanswered
        answer_slot(chain, task_id, slot["slot"], slot["verifiers"][0]["verifier"])
    chain.block()
    assert held["outcome"] == "pending" and all(s["outcome"] == "ok" for s in epoch_slots(task, 1))
    assert task.epochs.get("released", []) == []
    answer_slot(chain, task_id, held["slot"], held["verifiers"][-1]["verifier"])
    run_until(chain, lambda: task.epochs.get("released") == [0, 1])


@pytest.mark.parametrize("audits", [0, 2])
def test_without_audits_or_with_several_an_epoch_is_paid_in_full(audits):
    """With no audit slots an epoch pays out as it closes; with two a worker, both must resolve first."""
    chain = crew_chain(CREW, VERIFIER, HARDWARE, audits_per_worker=audits)
    task_id = submit(chain, expected_s=LONG_S)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    assert len(task.slots) == 3 * audits
    run_scheduled_draws(chain, task_id)
    answer_all_slots(chain, task_id)
    chain.block()
    assert task.epochs["released"] == [0]
    assert task.epochs["earned"] == {w.peer_id: part(share(), 0, EPOCHS) for w in CREW}
    assert chain.ledger.balance(OWNER.peer_id) < 1_000_000   # nothing refunded mid-run

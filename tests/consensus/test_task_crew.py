"""A crew that changes (docs/adr/0226, issue 23 item 3): when an epoch closes without a member's
commitment, the ledger names a free compute node to that member's seat from a later epoch on; the joiner
commits its epochs and its result like any member, is audited on the segments it trained and paid for the
epochs it covered, and the leaver for the ones it committed. Every test here fails on the code before ADR
0226 (a departed member's seat stayed empty and nobody could join a running task)."""
import pytest
from test_ledger_kit import CHAIN, answer_all_slots, crew_chain, ident, run_scheduled_draws, run_until
from test_task_epochs import (
    HARDWARE,
    OWNER,
    RESULT,
    VERIFIER,
    W1,
    W2,
    W3,
    commit_epoch,
    commit_result,
    expected_payouts,
    share,
    submit,
)

from consensus.block import build_block
from consensus.state.ledger import Ledger, task_json
from consensus.state.records import TaskStatus
from consensus.state.store import LedgerState
from consensus.task_info import TaskInfo
from consensus.txcodes import TxCode

SPARE, OUTSIDER = ident(7), ident(8)
EPOCHS = 3


@pytest.fixture
def chain():
    return spare_chain()


def spare_chain():
    """A crew of three and a spare compute node of the lowest weight (not chosen at assignment)."""
    chain = crew_chain((W1, W2, W3), VERIFIER, HARDWARE)
    chain.ok(SPARE, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                      "hardware": HARDWARE})
    chain.ok(SPARE, "bond", {"amount": 900})   # the lowest weight: not chosen at assignment
    return chain


def leave_in_epoch_0(chain, task_id):
    """W1 and W2 commit epoch 0, W3 never does: the epoch closes at its grace and W3 has left."""
    task = chain.ledger.state.tasks[task_id]
    assert sorted(task.workers) == sorted(w.peer_id for w in (W1, W2, W3))
    for worker in (W1, W2):
        assert commit_epoch(chain, worker, task_id, 0).code == TxCode.OK
    events = []
    while task.epochs["current"] == 0:
        events += chain.block().events
    return task, events


def test_a_leaver_is_replaced_and_the_joiner_and_leaver_are_each_paid_for_their_epochs(chain):
    task_id = submit(chain)
    task, events = leave_in_epoch_0(chain, task_id)
    seat = task.workers.index(W3.peer_id)
    assert task.workers[3] == SPARE.peer_id
    assert task.epochs["joined"] == {SPARE.peer_id: [seat, 2]}   # one past the furthest commitment (epoch 0)
    joined = [e for e in events if e["type"] == "worker_joined"]
    assert joined and joined[-1]["replaces"] == W3.peer_id and joined[-1]["epoch"] == 2
    assert chain.ledger.state.nodes[SPARE.peer_id].active_tasks == 1
    # the joiner commits nothing before its first epoch, and cannot reject the task it joined
    assert commit_epoch(chain, SPARE, task_id, 1).code == TxCode.BAD_STATE
    assert chain.run(SPARE, "reject_task", {"task_id": task_id, "reason": "no"}).code == TxCode.BAD_STATE
    for worker in (W1, W2):
        assert commit_epoch(chain, worker, task_id, 1).code == TxCode.OK
    assert task.epochs["current"] == 2     # the crew of epoch 1 (W1, W2) all committed: closed at once
    for worker in (W1, W2, SPARE):
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    assert task.status == TaskStatus.COMMITTED
    run_scheduled_draws(chain, task_id)
    spare_slots = [slot for slot in task.slots if slot["worker"] == SPARE.peer_id]
    assert spare_slots and all(4 <= slot["segment"] < 6 for slot in spare_slots)   # what it trained
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID and task.result == RESULT
    expected = expected_payouts(task, {W1.peer_id: share(), W2.peer_id: share(), SPARE.peer_id: share() // EPOCHS})
    assert task.payouts == expected and W3.peer_id not in task.epochs["earned"]   # it may have verified a slot
    assert chain.ledger.state.nodes[SPARE.peer_id].active_tasks == 0


def test_a_leaver_that_committed_epochs_is_paid_for_them_beside_its_replacement(chain):
    task_id = submit(chain, epochs=6)
    task = chain.ledger.state.tasks[task_id]
    for worker in (W1, W2, W3):
        assert commit_epoch(chain, worker, task_id, 0, segments=1).code == TxCode.OK
    for worker in (W1, W2):   # W3 leaves in epoch 1
        assert commit_epoch(chain, worker, task_id, 1, segments=2).code == TxCode.OK
    run_until(chain, lambda: task.epochs["current"] == 2)
    assert task.epochs["joined"] == {SPARE.peer_id: [task.workers.index(W3.peer_id), 3]}
    for epoch in (2, 3, 4):
        crew = (W1, W2) if epoch < 3 else (W1, W2, SPARE)
        for worker in crew:
            assert commit_epoch(chain, worker, task_id, epoch, segments=epoch + 1).code == TxCode.OK
        assert task.epochs["current"] == epoch + 1
    for worker in (W1, W2, SPARE):
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    assert task.commits[W3.peer_id][2] == 1 and task.commits[SPARE.peer_id][2] == 6
    run_scheduled_draws(chain, task_id)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    paid = {W1.peer_id: share(), W2.peer_id: share(), W3.peer_id: share() // 6, SPARE.peer_id: share() * 3 // 6}
    assert task.payouts == expected_payouts(task, paid)


def test_a_joiner_enters_past_the_furthest_commitment_so_no_member_has_read_its_epoch_crew(chain):
    task_id = submit(chain, epochs=6)
    task = chain.ledger.state.tasks[task_id]
    for epoch in (0, 1):   # W1 runs ahead: it committed epoch 1 and may already train epoch 2
        assert commit_epoch(chain, W1, task_id, epoch, segments=epoch + 1).code == TxCode.OK
    assert commit_epoch(chain, W2, task_id, 0, segments=1).code == TxCode.OK
    run_until(chain, lambda: task.epochs["current"] == 1)
    assert task.epochs["joined"][SPARE.peer_id][1] == 3


def test_no_seat_is_filled_when_the_joiner_would_enter_after_the_last_epoch(chain):
    task_id = submit(chain, epochs=2)   # a joiner would enter at epoch 2 of 2: nothing left to train
    task = chain.ledger.state.tasks[task_id]
    for worker in (W1, W2):
        assert commit_epoch(chain, worker, task_id, 0, segments=3).code == TxCode.OK
    run_until(chain, lambda: task.epochs["current"] == 1)
    assert "joined" not in task.epochs and SPARE.peer_id not in task.workers


def test_no_seat_is_filled_once_the_owner_asked_to_stop(chain):
    task_id = submit(chain)
    chain.ok(OWNER, "stop_task", {"task_id": task_id})
    task, _ = leave_in_epoch_0(chain, task_id)
    assert "joined" not in task.epochs and SPARE.peer_id not in task.workers


def test_a_replica_from_storage_names_the_same_joiner_with_the_same_app_hash(chain):
    task_id = submit(chain)
    for worker in (W1, W2):
        assert commit_epoch(chain, worker, task_id, 0).code == TxCode.OK
    replica = Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items()))
    task = chain.ledger.state.tasks[task_id]
    while task.epochs["current"] == 0:
        led = chain.ledger
        block = build_block(CHAIN, led.height + 1, 1000 * (led.height + 1), led.last_block_hash, led.app_hash,
                            chain.proposer_identity, led.beacon, [], ())
        results = [led.apply_block(block), replica.apply_block(block)]
        assert results[0].app_hash == results[1].app_hash and results[0].events == results[1].events
    assert "joined" in task.epochs and replica.state.tasks[task_id] == task
    reloaded = LedgerState.load(chain.ledger.storage_items()).tasks[task_id]
    assert reloaded.epochs["joined"] == task.epochs["joined"] and reloaded.workers == task.workers


def test_the_task_doc_gives_each_worker_its_seat_and_the_crew_of_each_epoch(chain):
    task_id = submit(chain)
    task, _ = leave_in_epoch_0(chain, task_id)
    info = TaskInfo.from_json(task_json(task_id, task, chain.ledger.state.last_block_time_ms))
    seat = task.workers.index(W3.peer_id)
    assert info.seat_of(SPARE.peer_id) == seat and info.seat_of(W3.peer_id) == seat
    assert info.first_epoch(SPARE.peer_id) == 2 and info.first_epoch(W1.peer_id) == 0
    assert info.crew_at(1) == sorted([W1.peer_id, W2.peer_id])
    assert info.crew_at(2) == sorted([W1.peer_id, W2.peer_id, SPARE.peer_id])


def test_a_joiner_whose_epoch_never_opened_because_the_task_stopped_is_not_a_no_show(chain):
    task_id = submit(chain, epochs=6)
    task = chain.ledger.state.tasks[task_id]
    for worker in (W1, W2):
        assert commit_epoch(chain, worker, task_id, 0, segments=1).code == TxCode.OK
    run_until(chain, lambda: task.epochs["current"] == 1)
    assert task.epochs["joined"][SPARE.peer_id][1] == 2
    reputation = chain.ledger.state.nodes[SPARE.peer_id].reputation
    run_until(chain, lambda: task.status not in ("assigned", "running"))   # the crew stops committing
    assert task.epochs["stopped"] == 1
    run_scheduled_draws(chain, task_id)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.STOPPED
    assert chain.ledger.state.nodes[SPARE.peer_id].reputation == reputation   # it never had an epoch to train
    assert chain.ledger.state.nodes[SPARE.peer_id].active_tasks == 0

"""The owner's ``stop_task`` (docs/adr/0211, issue 23 item 2): the run ends at the next epoch boundary,
the workers are paid for the epochs they committed, the unspent escrow goes back to the owner, and the
task settles ``stopped``; a task nobody was paid for never reads ``paid`` (the issue's first finding).
Every stop test fails on the code before ADR 0211 (no ``stop_task`` transaction, no ``stopped`` status)."""
import pytest
import test_task_epochs as kit
from test_ledger_kit import answer_all_slots, crew_chain, ident, run_scheduled_draws

from consensus.ledger_events import task_events
from consensus.state.records import TaskStatus
from consensus.txcodes import TxCode

EPOCHS, HARDWARE, OUTSIDER, OWNER, PRICE = kit.EPOCHS, kit.HARDWARE, kit.OUTSIDER, kit.OWNER, kit.PRICE
VERIFIER = kit.VERIFIER
W1, W2, W3 = kit.W1, kit.W2, kit.W3
all_commit_epoch, commit_epoch, commit_result, expected_payouts = (kit.all_commit_epoch, kit.commit_epoch,
                                                                   kit.commit_result, kit.expected_payouts)
run_until, share, submit = kit.run_until, kit.share, kit.submit


@pytest.fixture
def chain():
    return crew_chain((W1, W2, W3), VERIFIER, HARDWARE)


def stop(chain, task_id, who=OWNER):
    return chain.run(who, "stop_task", {"task_id": task_id})


def settle(chain, task_id):
    run_scheduled_draws(chain, task_id)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})


def test_the_owner_stops_a_run_at_the_next_epoch_boundary_pays_its_epochs_refunds_the_rest(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)                     # epoch 1 of 3 closed; epoch 2 open
    before = {w.peer_id: chain.ledger.balance(w.peer_id) for w in (OWNER, W1, W2, W3)}
    assert stop(chain, task_id).code == TxCode.OK
    assert task.epochs["stop_at"] == 1 and task.status == TaskStatus.RUNNING   # epoch 2 still runs to its end
    assert stop(chain, task_id).code == TxCode.ALREADY_KNOWN
    result = all_commit_epoch(chain, task_id, 1)             # the boundary: the task stops there
    stopped = next(e for e in result.events if e["type"] == "task_stopped")
    assert stopped["by_owner"] and stopped["closed"] == 2
    assert "stopped" in [e["event"] for e in task_events(result)]
    assert task.status == TaskStatus.COMMITTED and task.epochs["stopped"] == 2
    assert "stopped by its owner at the end of epoch 2 of 3" in task.reason
    assert {w: c[2] for w, c in task.commits.items()} == {w.peer_id: 4 for w in (W1, W2, W3)}
    assert commit_result(chain, W1, task_id).code == TxCode.BAD_STATE   # no third epoch
    settle(chain, task_id)
    assert task.status == TaskStatus.STOPPED and task.escrow == 0
    expected = expected_payouts(task, {w.peer_id: share() * 2 // EPOCHS for w in (W1, W2, W3)})
    assert task.payouts == expected
    assert expected[OWNER.peer_id] >= 3 * (share() // EPOCHS)      # the third epoch of every worker came back
    for peer_id, amount in expected.items():
        if peer_id in before:
            assert chain.ledger.balance(peer_id) - before[peer_id] == amount
    doc = chain.ledger.task_info(task_id)
    assert doc["status"] == "stopped" and doc["epochs"]["stop_at"] == 1 and doc["epochs"]["stopped"] == 2


def test_a_stop_holds_workers_that_ran_ahead_to_the_boundary_and_a_leaver_to_what_it_committed(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    assert commit_epoch(chain, W1, task_id, 0).code == TxCode.OK
    assert commit_epoch(chain, W1, task_id, 1).code == TxCode.OK     # W1 runs ahead into epoch 2
    assert stop(chain, task_id).code == TxCode.OK                    # stop at the end of epoch 1
    assert commit_epoch(chain, W2, task_id, 0).code == TxCode.OK     # a quorum: W3 died
    run_until(chain, lambda: task.status != TaskStatus.RUNNING)
    assert task.epochs["stopped"] == 1 and "by its owner at the end of epoch 1 of 3" in task.reason
    assert {w: c[2] for w, c in task.commits.items()} == {W1.peer_id: 2, W2.peer_id: 2}   # W3 committed nothing
    settle(chain, task_id)
    assert task.status == TaskStatus.STOPPED
    assert task.payouts == expected_payouts(task, {W1.peer_id: share() // EPOCHS, W2.peer_id: share() // EPOCHS})


@pytest.mark.parametrize("case", ["outsider", "worker", "created", "last_epoch", "one_epoch", "ended"])
def test_a_stop_is_refused_with_a_reason_and_changes_nothing(chain, case):
    if case == "created":   # nobody to assign: the task waits
        chain = crew_chain((W1, W2, W3), VERIFIER, HARDWARE)
        task_id = submit(chain, workers=3, profile="cpu-other/torch-0")
    elif case == "one_epoch":
        task_id = submit(chain, epochs=1)
    else:
        task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    if case == "last_epoch":
        all_commit_epoch(chain, task_id, 0)
        all_commit_epoch(chain, task_id, 1)
    if case == "ended":
        run_until(chain, lambda: task.status == TaskStatus.EXPIRED)
    sender = {"outsider": ident(40), "worker": W1}.get(case, OWNER)
    if case == "outsider":
        chain.ok(ident(1), "transfer", {"to": sender.peer_id, "amount": 1000})
    before = (task.status, dict(task.epochs), chain.ledger.balance(OWNER.peer_id))
    receipt = stop(chain, task_id, sender)
    code = TxCode.UNAUTHORIZED if case in ("outsider", "worker") else TxCode.BAD_STATE
    assert receipt.code == code, receipt
    assert (task.status, dict(task.epochs), chain.ledger.balance(OWNER.peer_id)) == before
    assert {"created": "cancel it", "last_epoch": "last epoch", "one_epoch": "not cut into epochs",
            "ended": "expired"}.get(case, "owner") in receipt.log


def test_a_task_whose_crew_all_missed_the_deadline_reads_expired_not_paid(chain):
    """The issue's first finding: every worker trained past the deadline and failed its commit; the task
    said ``paid`` with ``payouts: {owner: price}``. It reads ``expired`` with the reason, and every
    reader of the status (the ledger document, the events) agrees."""
    task_id = submit(chain, epochs=1)
    task = chain.ledger.state.tasks[task_id]
    deadline = task.commit_deadline
    results = []
    while task.status == TaskStatus.ASSIGNED:
        results.append(chain.block())
    assert chain.ledger.state.last_block_time_ms >= deadline
    late = commit_result(chain, W1, task_id)
    assert late.code == TxCode.BAD_STATE                           # the late commit of the finding
    assert task.status == TaskStatus.EXPIRED and task.payouts == {OWNER.peer_id: PRICE}
    assert "no worker committed a result by the commit deadline" in task.reason
    assert chain.ledger.task_info(task_id)["status"] == "expired"
    names = [e["event"] for r in results for e in task_events(r)]
    assert "expired" in names and "finalized" not in names
    assert chain.run(OUTSIDER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE   # nothing can make it paid
    assert task.status == TaskStatus.EXPIRED

"""A crew that died (docs/adr/0232, issue 23 item 3: "if every member dies, the task resumes from the last
committed epoch on a new crew"): when the open epoch's deadline passes with no commitment of it after an
epoch closed, the ledger names a new crew to the open epoch, starting from the state committed for the
epoch before, instead of stopping the task; bounded per task, never after the owner's stop, never when a
live minority committed the epoch, and nobody is paid twice for a seat's epoch. The tests of the restart
itself fail on the code before ADR 0232 (the task stopped at its last closed epoch); the others pin the
cases where it still stops."""
import dataclasses

import pytest
from test_ledger_kit import CHAIN, Chain, answer_all_slots, answer_slot, ident, run_scheduled_draws, run_until
from test_task_epochs import (
    HARDWARE,
    OWNER,
    RESULT,
    VERIFIER,
    W1,
    W2,
    W3,
    all_commit_epoch,
    commit_epoch,
    commit_result,
    expected_payouts,
    share,
    submit,
)

from cli.task_epochs import epoch_lines
from consensus.block import build_block
from consensus.genesis import GenesisError, Params, hashed_params
from consensus.state.epochs import unavailable_evidence
from consensus.state.ledger import Ledger, task_json
from consensus.state.records import TaskStatus
from consensus.state.store import LedgerState
from consensus.task_info import TaskInfo
from consensus.txcodes import TxCode
from ml.compute.epoch_commits import crew_exit

OUTSIDER = ident(9)
SPARES = tuple(ident(i) for i in range(10, 16))
CREW = (W1, W2, W3)


def restart_chain(spares: int = 3, **params) -> Chain:
    """The epoch tests' chain (three workers bonded 3000, 2000, 1000 and a verifier) with ``spares`` more
    compute nodes bonded less (never chosen at assignment) and ``params`` changed."""
    base = Params(task_min_s=12, task_slack_s=0, audit_window_s=2, min_fee=0, audits_per_worker=1,
                  audit_double_bps=0, stake_cover_bps=0, max_audit_share_bps=10_000)
    funded = {ident(i).peer_id: 1_000_000 for i in range(1, 16)}
    chain = Chain(balances=funded, params=dataclasses.replace(base, **params))
    for node, bond in [*zip(CREW, (3000, 2000, 1000)), *zip(SPARES[:spares], range(900, 0, -100))]:
        chain.ok(node, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                         "hardware": HARDWARE})
        chain.ok(node, "bond", {"amount": bond})
    chain.ok(VERIFIER, "register_node", {"roles": ["verifier"], "listen_addrs": [], "relay_addrs": [],
                                         "hardware": HARDWARE})
    chain.ok(VERIFIER, "bond", {"amount": 500})
    return chain


@pytest.fixture
def chain():
    return restart_chain()


def die_in_epoch_1(chain, task_id):
    """The crew commits epoch 0, then every member dies: nobody commits epoch 1 by its deadline."""
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    assert task.epochs["current"] == 1
    events = []
    deadline = task.commit_deadline
    while task.commit_deadline == deadline and task.status in TaskStatus.OPEN_FOR_COMMITS:
        events += chain.block().events
    return task, events


def ids(nodes):
    return [node.peer_id for node in nodes]


def test_a_crew_that_died_resumes_from_the_last_committed_epoch_on_a_new_crew_and_is_paid(chain):
    task_id = submit(chain)
    task, events = die_in_epoch_1(chain, task_id)
    assert task.status == TaskStatus.RUNNING and "stopped" not in task.epochs   # not stopped: restarted
    restarted = [e for e in events if e["type"] == "crew_restarted"]
    assert restarted and restarted[0]["epoch"] == 1 and restarted[0]["from_epoch"] == 0
    new_crew = SPARES[:3]
    assert sorted(restarted[0]["workers"]) == sorted(ids(new_crew)) and task.epochs["restarts"] == 1
    seats = {w: task.workers.index(w) for w in ids(CREW)}
    joined = {e["replaces"]: (e["worker"], e["seat"], e["epoch"]) for e in events if e["type"] == "worker_joined"}
    assert {old: (seat, epoch) for old, (_, seat, epoch) in joined.items()} == {w: (s, 1) for w, s in seats.items()}
    assert task.commit_deadline == restarted[0]["deadline"] > chain.ledger.state.last_block_time_ms
    # the new crew enters at the open epoch and closes it, then trains to the end
    all_commit_epoch(chain, task_id, 1, workers=new_crew)
    assert task.epochs["current"] == 2
    for worker in new_crew:
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    assert task.status == TaskStatus.COMMITTED
    run_scheduled_draws(chain, task_id)
    for slot in task.slots:   # each is audited on what it trained: the old crew epoch 0, the new one 1 and 2
        assert (slot["segment"] < 2) if slot["worker"] in ids(CREW) else (2 <= slot["segment"] < 6)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID and task.result == RESULT
    paid = {**{w: share() // 3 for w in ids(CREW)}, **{w: share() * 2 // 3 for w in ids(new_crew)}}
    assert task.payouts == expected_payouts(task, paid)
    assert all(chain.ledger.state.nodes[w].active_tasks == 0 for w in ids(CREW + new_crew))


def test_an_old_member_cannot_commit_after_the_restart_nor_be_paid_twice_for_a_seat(chain):
    task_id = submit(chain)
    task, _ = die_in_epoch_1(chain, task_id)
    # W1 was only slow: its late commitment of the restarted epoch, or a result, is refused
    assert commit_epoch(chain, W1, task_id, 1).code == TxCode.BAD_STATE
    new_crew = SPARES[:3]
    all_commit_epoch(chain, task_id, 1, workers=new_crew)
    assert commit_result(chain, W1, task_id).code == TxCode.BAD_STATE
    for worker in new_crew:
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    run_scheduled_draws(chain, task_id)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    as_verifier = expected_payouts(task, {})   # what each node earned answering audit slots
    info = TaskInfo.from_json(task_json(task_id, task, chain.ledger.state.last_block_time_ms))
    for seat in range(3):   # each seat is paid its share once: epoch 0 to the old worker, 1-2 to the new
        holders = [w for w in task.workers if info.seat_of(w) == seat]
        pay = {w: task.payouts.get(w, 0) - as_verifier.get(w, 0) for w in holders}
        assert sorted(pay.values()) == [share() // 3, share() * 2 // 3]


def test_a_worker_of_the_dead_crew_is_never_named_again_even_when_free(chain):
    chain = restart_chain(spares=3, max_tasks_per_worker=2)   # W1 (the heaviest) would be free for the seat
    task_id = submit(chain)
    task, events = die_in_epoch_1(chain, task_id)
    joined = [e["worker"] for e in events if e["type"] == "worker_joined"]
    assert sorted(joined) == sorted(ids(SPARES[:3])) and not set(joined) & set(ids(CREW))


def test_restarts_are_bounded_so_a_task_cannot_be_kept_open_forever(chain):
    chain = restart_chain(spares=6, crew_restarts=1)
    task_id = submit(chain, epochs=3)
    task, _ = die_in_epoch_1(chain, task_id)
    assert task.epochs["restarts"] == 1 and task.status == TaskStatus.RUNNING
    run_until(chain, lambda: task.status not in TaskStatus.OPEN_FOR_COMMITS)   # the new crew dies too
    assert task.epochs["stopped"] == 1 and task.epochs["restarts"] == 1    # spares were free: the bound held
    assert not set(task.workers) & set(ids(SPARES[3:]))
    run_scheduled_draws(chain, task_id)
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.STOPPED
    for worker in ids(SPARES[:3]):   # named and never showed: a no-show, unpaid
        assert worker not in task.payouts and chain.ledger.state.nodes[worker].reputation < 0


def test_no_restart_at_all_when_the_genesis_allows_none(chain):
    chain = restart_chain(crew_restarts=0)
    task_id = submit(chain)
    task, events = die_in_epoch_1(chain, task_id)
    assert task.epochs["stopped"] == 1 and not [e for e in events if e["type"] == "crew_restarted"]


def test_crew_restarts_is_a_bounded_genesis_param_hashed_only_when_set():
    with pytest.raises(GenesisError, match="crew_restarts"):
        Params(crew_restarts=9).validate()
    assert "crew_restarts" not in hashed_params(Params())   # a genesis file written before it keeps its hash
    assert hashed_params(Params(crew_restarts=1))["crew_restarts"] == 1


def test_no_restart_once_the_owner_asked_to_stop(chain):
    task_id = submit(chain)
    all_commit_epoch(chain, task_id, 0)
    chain.ok(OWNER, "stop_task", {"task_id": task_id})   # the owner stops after epoch 1; the crew dies in it
    task = chain.ledger.state.tasks[task_id]
    run_until(chain, lambda: task.status not in TaskStatus.OPEN_FOR_COMMITS)
    assert task.epochs["stopped"] == 1 and "joined" not in task.epochs and "restarts" not in task.epochs


def test_a_live_minority_that_committed_the_open_epoch_is_not_thrown_away(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)
    assert commit_epoch(chain, W1, task_id, 1).code == TxCode.OK   # below quorum, but W1 lives on
    run_until(chain, lambda: task.status not in TaskStatus.OPEN_FOR_COMMITS)
    assert task.epochs["stopped"] == 1 and "joined" not in task.epochs


def test_no_restart_without_a_closed_epoch_to_start_from(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    run_until(chain, lambda: task.status != TaskStatus.ASSIGNED)
    assert task.status == TaskStatus.EXPIRED and task.payouts == {OWNER.peer_id: 9_000}
    assert "joined" not in task.epochs


def test_no_restart_when_fewer_than_a_quorum_of_seats_can_be_filled(chain):
    chain = restart_chain(spares=1)
    task_id = submit(chain)
    task, _ = die_in_epoch_1(chain, task_id)
    assert task.epochs["stopped"] == 1 and SPARES[0].peer_id not in task.workers
    assert chain.ledger.state.nodes[SPARES[0].peer_id].active_tasks == 0


def test_a_joiner_waiting_for_a_later_epoch_keeps_its_seat_and_starts_from_the_new_crew(chain):
    task_id = submit(chain, epochs=6)
    task = chain.ledger.state.tasks[task_id]
    for worker in (W1, W2):   # W3 leaves in epoch 0; SPARES[0] is named to its seat from epoch 2
        assert commit_epoch(chain, worker, task_id, 0, segments=1).code == TxCode.OK
    run_until(chain, lambda: task.epochs["current"] == 1)
    waiting = SPARES[0].peer_id
    assert task.epochs["joined"] == {waiting: [task.workers.index(W3.peer_id), 2]}
    run_until(chain, lambda: task.epochs.get("restarts") == 1)   # then W1 and W2 die in epoch 1
    assert task.epochs["joined"][waiting] == [task.workers.index(W3.peer_id), 2]   # not displaced
    new_crew = SPARES[1:3]
    assert {task.epochs["joined"][w.peer_id][1] for w in new_crew} == {1}
    for worker in new_crew:
        assert commit_epoch(chain, worker, task_id, 1, segments=2).code == TxCode.OK
    assert task.epochs["current"] == 2   # the new crew of epoch 1 is complete: it closed at once
    info = TaskInfo.from_json(task_json(task_id, task, chain.ledger.state.last_block_time_ms))
    assert info.crew_at(1) == sorted(ids(new_crew)) and info.crew_at(2) == sorted([waiting, *ids(new_crew)])
    for worker in (*new_crew, SPARES[0]):
        assert commit_epoch(chain, worker, task_id, 2, segments=3).code == TxCode.OK
    assert task.epochs["current"] == 3


def test_the_task_doc_shows_the_new_crew_and_tells_the_old_one_it_left(chain):
    task_id = submit(chain)
    task, _ = die_in_epoch_1(chain, task_id)
    info = TaskInfo.from_json(task_json(task_id, task, chain.ledger.state.last_block_time_ms))
    assert info.crew_at(0) == sorted(ids(CREW)) and info.crew_at(1) == sorted(ids(SPARES[:3]))
    assert all("restarted on a new crew" in crew_exit(info, w) for w in ids(CREW))
    assert not any(crew_exit(info, w) for w in ids(SPARES[:3]))
    assert all(info.first_epoch(w) == 1 and info.seat_of(w) == info.seat_of(old)
               for w, old in zip(sorted(ids(SPARES[:3]), key=info.seat_of), sorted(ids(CREW), key=info.seat_of)))
    lines = epoch_lines(info)   # task show
    assert "crew restarted 1x" in lines[0] and info.epochs.restarts == 1
    assert sum("(left the crew)" in line for line in lines) == 3
    assert sum("(joined at epoch 2" in line for line in lines) == 3


def test_a_replica_from_storage_restarts_the_same_crew_with_the_same_app_hash(chain):
    task_id = submit(chain)
    all_commit_epoch(chain, task_id, 0)
    replica = Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items()))
    task = chain.ledger.state.tasks[task_id]
    for _ in range(100):   # the epoch's deadline is 40 blocks away
        if "restarts" in task.epochs or task.status not in TaskStatus.OPEN_FOR_COMMITS:
            break
        led = chain.ledger
        block = build_block(CHAIN, led.height + 1, 1000 * (led.height + 1), led.last_block_hash, led.app_hash,
                            chain.proposer_identity, led.beacon, [], ())
        results = [led.apply_block(block), replica.apply_block(block)]
        assert results[0].app_hash == results[1].app_hash and results[0].events == results[1].events
    assert task.epochs.get("restarts") == 1 and replica.state.tasks[task_id] == task
    reloaded = LedgerState.load(chain.ledger.storage_items()).tasks[task_id]
    assert reloaded.epochs == task.epochs and reloaded.workers == task.workers


def test_a_dead_member_its_verifier_cannot_reach_is_unaudited_once_the_crew_restarted_not_slashed(chain):
    task_id = submit(chain, expected_s=600)   # epochs of 200 s: the challenge deadline passes within the epoch
    task = chain.ledger.state.tasks[task_id]
    all_commit_epoch(chain, task_id, 0)   # epoch 0 is audited as it closes (ADR 0230)
    run_scheduled_draws(chain, task_id)
    dead = next(slot for slot in task.slots if slot["worker"] == W1.peer_id)
    for other in task.slots:
        if other is not dead:
            answer_slot(chain, task_id, other["slot"], other["verifiers"][0]["verifier"])
    answer_slot(chain, task_id, dead["slot"], dead["verifiers"][0]["verifier"], match=False,
                evidence=unavailable_evidence(dead["salt"]), step=1)
    bonded = chain.ledger.state.stakes[W1.peer_id].bonded
    run_until(chain, lambda: chain.ledger.state.last_block_time_ms > dead["challenge"]["deadline"] + 1000)
    assert dead["outcome"] == "pending"   # silent, and still in the crew: withholding or gone? (ADR 0230)
    run_until(chain, lambda: task.epochs.get("restarts") == 1, limit=1000)   # the whole crew was gone
    chain.block()
    assert task.status in TaskStatus.OPEN_FOR_COMMITS and "stopped" not in task.epochs
    assert dead["outcome"] == "unaudited" and chain.ledger.state.stakes[W1.peer_id].bonded == bonded
    assert task.epochs.get("released") == [0] and W1.peer_id not in task.epochs.get("earned", {})
    assert all(task.epochs["earned"][w] == share() // 3 for w in ids((W2, W3)))   # audited ok: epoch 0 paid

"""A crew that grows (docs/adr/0234, issue 23 item 3): an owner who sets ``max_workers`` above ``workers``
lets the ledger open extra seats at epoch boundaries for free compute nodes; the price pays that many seats,
each extra worker is paid for the epochs it trained and the seats and epochs nobody took go back to the owner.
The training world of each epoch is the seats open by then. Every test here fails on the code before ADR
0234 (no ``max_workers`` field: the crew never grew past its first seats)."""
import pytest
from test_ledger_kit import answer_all_slots, crew_chain, ident, run_scheduled_draws, run_until
from test_task_epochs import HARDWARE, OWNER, PRICE, RESULT, VERIFIER, W1, W2, W3, commit_epoch, commit_result, submit

from consensus.genesis import Params
from consensus.state.epoch_pay import part
from consensus.state.ledger import task_json
from consensus.state.records import TaskStatus
from consensus.state.tasks import required_worker_stake, worker_share
from consensus.task_info import TaskInfo
from consensus.txcodes import TxCode, TxError

S1, S2, OUTSIDER = ident(7), ident(8), ident(9)
EPOCHS = 6


def chain_with_spares(*spares):
    """A crew of three and ``spares``: free compute nodes of lower weight (not chosen at assignment)."""
    chain = crew_chain((W1, W2, W3), VERIFIER, HARDWARE)
    for spare in spares:
        chain.ok(spare, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                          "hardware": HARDWARE})
        chain.ok(spare, "bond", {"amount": 900})
    return chain


def commit_all(chain, task_id, epoch, crew):
    for worker in crew:
        assert commit_epoch(chain, worker, task_id, epoch, segments=epoch + 1).code == TxCode.OK


def info(chain, task_id) -> TaskInfo:
    return TaskInfo.from_json(task_json(task_id, chain.ledger.state.tasks[task_id],
                                        chain.ledger.state.last_block_time_ms))


def test_extra_seats_open_at_an_epoch_close_and_each_worker_is_paid_for_its_epochs():
    chain = chain_with_spares(S1, S2)
    task_id = submit(chain, epochs=EPOCHS, max_workers=5)
    task = chain.ledger.state.tasks[task_id]
    assert task.spec["max_workers"] == 5 and len(task.workers) == 3   # assignment fills the seats asked for
    commit_all(chain, task_id, 0, (W1, W2, W3))
    # epoch 0 closed: both spares take new seats, entering one past the furthest commitment
    assert task.epochs["joined"] == {S1.peer_id: [3, 2], S2.peer_id: [4, 2]}
    seen = info(chain, task_id)
    assert [seen.world_at(epoch) for epoch in range(EPOCHS)] == [3, 3, 5, 5, 5, 5]
    assert seen.shards_from(1) == 0 and seen.shards_from(4) == 2   # epoch 2's first segment: the new cut
    assert seen.seat_of(S2.peer_id) == 4 and seen.max_seats == 5
    commit_all(chain, task_id, 1, (W1, W2, W3))
    assert task.epochs["current"] == 2   # the joiners had nothing to commit in epoch 1
    for epoch in (2, 3, 4):
        commit_all(chain, task_id, epoch, (W1, W2, W3, S1, S2))
        assert task.epochs["current"] == epoch + 1
    for worker in (W1, W2, W3, S1, S2):
        assert commit_result(chain, worker, task_id).code == TxCode.OK
    assert task.status == TaskStatus.COMMITTED
    run_scheduled_draws(chain, task_id)
    extra_slots = [slot for slot in task.slots if slot["worker"] in (S1.peer_id, S2.peer_id)]
    assert extra_slots and all(slot["segment"] >= 2 for slot in extra_slots)   # only what they trained
    answer_all_slots(chain, task_id)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID and task.result == RESULT
    seat = worker_share(Params(), PRICE, 5)   # the price pays five seats
    late = sum(part(seat, epoch, EPOCHS) for epoch in range(2, EPOCHS))
    earned = task.epochs["earned"]
    assert [earned[w.peer_id] for w in (W1, W2, W3)] == [seat] * 3
    assert earned[S1.peer_id] == earned[S2.peer_id] == late < seat
    # the owner gets the rest back: at least the two extra seats' first two epochs nobody trained
    paid_out = sum(amount for peer, amount in task.payouts.items() if peer != OWNER.peer_id)
    assert task.payouts[OWNER.peer_id] == PRICE - paid_out >= 2 * (seat - late)
    assert task.escrow == 0   # and every block checked the supply invariant (devtools/ledger_chain.py)


def test_the_crew_grows_no_further_than_max_workers():
    chain = chain_with_spares(S1, S2)
    task_id = submit(chain, epochs=EPOCHS, max_workers=4)
    task = chain.ledger.state.tasks[task_id]
    commit_all(chain, task_id, 0, (W1, W2, W3))
    assert list(task.epochs["joined"]) == [S1.peer_id] and task.epochs["joined"][S1.peer_id][0] == 3
    commit_all(chain, task_id, 1, (W1, W2, W3))
    for epoch in (2, 3):
        commit_all(chain, task_id, epoch, (W1, W2, W3, S1))
    assert len(task.workers) == 4 and info(chain, task_id).world_at(EPOCHS - 1) == 4   # S2 stays free
    assert chain.ledger.state.nodes[S2.peer_id].active_tasks == 0


def test_a_task_that_does_not_ask_to_grow_keeps_its_seats():
    chain = chain_with_spares(S1)
    task_id = submit(chain, epochs=EPOCHS)
    task = chain.ledger.state.tasks[task_id]
    commit_all(chain, task_id, 0, (W1, W2, W3))
    assert "max_workers" not in task.spec and "joined" not in task.epochs
    assert info(chain, task_id).world_at(3) == 3 and info(chain, task_id).max_seats == 3


def test_a_leaver_in_an_extra_seat_is_replaced_in_that_seat_and_the_world_stays():
    chain = chain_with_spares(S1, S2)
    task_id = submit(chain, epochs=EPOCHS, max_workers=4)
    task = chain.ledger.state.tasks[task_id]
    commit_all(chain, task_id, 0, (W1, W2, W3))
    assert task.epochs["joined"] == {S1.peer_id: [3, 2]}
    commit_all(chain, task_id, 1, (W1, W2, W3))
    commit_all(chain, task_id, 2, (W1, W2, W3))   # S1 never shows up: it misses epoch 2, its first
    run_until(chain, lambda: task.epochs["current"] == 3)
    assert task.epochs["joined"][S2.peer_id] == [3, 4]   # its seat, not a new one: the crew stays at four
    seen = info(chain, task_id)
    assert [seen.world_at(epoch) for epoch in range(EPOCHS)] == [3, 3, 4, 4, 4, 4]
    assert seen.shards_from(5) == 2


@pytest.mark.parametrize("changes, why", [
    ({"max_workers": 2}, "below"),
    ({"max_workers": 5, "epochs": 1}, "epoch boundaries"),
])
def test_a_submit_with_a_bad_max_workers_is_refused_and_costs_nothing(changes, why):
    chain = chain_with_spares()
    before = chain.ledger.balance(OWNER.peer_id)
    result = chain.run(OWNER, "submit_task", {**_spec(), **changes})
    assert result.code != TxCode.OK and why in result.log
    assert chain.ledger.balance(OWNER.peer_id) == before


def test_a_max_workers_past_the_transaction_limit_does_not_decode():
    chain = chain_with_spares()
    with pytest.raises(TxError, match="max_workers"):
        chain.tx(OWNER, "submit_task", {**_spec(), "max_workers": 65})


def test_a_seat_of_a_crew_that_may_grow_pays_a_share_of_the_price_over_its_seats():
    chain = chain_with_spares()
    grown = chain.ledger.state.tasks[submit(chain, epochs=EPOCHS, max_workers=6)]
    fixed = chain.ledger.state.tasks[submit(chain, epochs=EPOCHS)]
    params = Params(stake_cover_bps=10_000)
    assert worker_share(params, PRICE, 6) * 2 <= worker_share(params, PRICE, 3)
    assert required_worker_stake(params, grown) <= required_worker_stake(params, fixed)


def _spec():
    from test_task_epochs import SPEC
    return {**SPEC, "price": PRICE}

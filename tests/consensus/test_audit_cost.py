"""The audit overhead budget (docs/adr/0212): a task's audits replay m x (1 + p) / K of its work; above
``max_audit_share_bps`` the owner escrows a surcharge on top of the price that goes to the verifier
pool; the CLI cuts a short job into enough segments to stay within the budget."""
import argparse

from test_audit_slots import OWNER, PRICE, committed_task, make_chain, submit
from test_ledger_kit import answer_all_slots

from cli.task_inputs import task_inputs
from cli.task_submit import audit_text, build_spec
from consensus.genesis import Params
from consensus.state.audit_cost import audit_share_bps, audit_surcharge, min_segments, segment_steps_for


def test_the_share_and_the_surcharge_follow_the_segment_count():
    params = Params()                                   # m = 2, p = 0.5: 3 segment replays per worker
    assert audit_share_bps(params, 12) == 2_500 and audit_share_bps(params, 30) == 1_000
    assert min_segments(params) == 30
    assert audit_surcharge(params, 100_000, 30) == 0 and audit_surcharge(params, 100_000, 60) == 0
    assert audit_surcharge(params, 100_000, 12) == 15_000          # (25% - 10%) of the price
    assert audit_surcharge(Params(max_audit_share_bps=10_000), 100_000, 12) == 0


def test_each_epoch_is_audited_so_the_share_counts_the_epochs():
    """Every epoch of a task gets its own slots (docs/adr/0230): 60 segments in 4 epochs are 15 an epoch,
    like a task of 15 segments; the ledger escrows that surcharge at submit."""
    params = Params()
    assert audit_share_bps(params, 60, 4) == audit_share_bps(params, 15) == 2_000
    assert audit_surcharge(params, 100_000, 60, 4) == 10_000 and audit_surcharge(params, 120, 120, 4) == 0
    assert "at least 30 segments per epoch" in audit_text(60, 100_000, 4)


def test_a_task_with_few_segments_escrows_the_surcharge_and_its_verifiers_get_it():
    chain = make_chain(max_audit_share_bps=1_000)       # m = 2, p = 0, K = 4: 50%, 40 points over
    before = chain.ledger.state.accounts[OWNER.peer_id].balance
    task_id, task, _ = committed_task(chain)
    surcharge = PRICE * 4_000 // 10_000
    assert task.spec["audit_surcharge"] == surcharge and task.escrow == PRICE + surcharge
    assert chain.ledger.state.accounts[OWNER.peer_id].balance == before - PRICE - surcharge
    answer_all_slots(chain, task_id)
    chain.empty_blocks(3)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    verifiers = {v["verifier"] for slot in task.slots for v in slot["verifiers"]} - set(task.workers)
    paid_to_verifiers = sum(task.payouts.get(v, 0) for v in verifiers)
    assert paid_to_verifiers > surcharge                 # the pool and the surcharge, split over the slots
    unsurcharged = make_chain()
    plain_id = submit(unsurcharged)
    assert "audit_surcharge" not in unsurcharged.ledger.state.tasks[plain_id].spec


def test_a_cancelled_task_refunds_its_surcharge():
    chain = make_chain(workers=(), max_audit_share_bps=1_000)   # nobody to assign: it can be cancelled
    before = chain.ledger.state.accounts[OWNER.peer_id].balance
    task_id = submit(chain)
    chain.ok(OWNER, "cancel_task", {"task_id": task_id})
    assert chain.ledger.state.accounts[OWNER.peer_id].balance == before


def test_the_cli_cuts_a_short_job_into_enough_segments_and_says_what_audits_cost():
    params = Params()
    assert [segment_steps_for(params, steps) for steps in (10, 60, 120, 400, 600, 5_000)] == [1, 1, 3, 10, 10, 10]
    args = argparse.Namespace(workers=3, codec="fp32", steps=120, sync="allreduce", model="digits-mlp",
                              dataset="digits", eval=None)
    spec = build_spec(args, task_inputs("digits-mlp", "digits", None, lambda path: ""))
    assert spec.segment_steps == 3 and spec.segment_count == 40
    assert audit_share_bps(params, spec.segment_count) <= params.max_audit_share_bps
    assert "surcharge" not in audit_text(spec.segment_count, 1_000)
    short = audit_text(12, 100_000)
    assert "25.0% of the work" in short and "surcharge of 15000" in short and "30 segments" in short

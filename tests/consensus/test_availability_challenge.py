"""Availability challenges (docs/adr/0207): "I could not fetch" is never slashable for the verifier; it
challenges the worker, which answers with its record's leaf and audit path or is guilty of withholding."""
import pytest
from test_audit_slots import (
    OWNER,
    POOL,
    SEGMENTS,
    VERIFIERS,
    W1,
    W2,
    WORKER_SHARE,
    answer_rest_honestly,
    make_chain,
    run_draws,
    slashed,
    slots_of,
    submit,
    vote,
)
from test_ledger_kit import HONEST_EVIDENCE, answer_slot, identity_of, run_scheduled_draws

from consensus.ledger_events import task_events
from consensus.state.epochs import unavailable_evidence
from consensus.state.ledger import Ledger
from consensus.state.store import LedgerState
from consensus.tx import build_tx
from consensus.txcodes import TxCode, TxError
from node.merkle import audit_path, merkle_root

LEAVES = {who.peer_id: [bytes([i, j]) * 16 for j in range(SEGMENTS)] for i, who in enumerate((W1, W2), 1)}


def committed_task(chain):
    """A task both workers committed to with real Merkle roots over their (test) leaves; slots drawn."""
    task_id = submit(chain)
    txs = [chain.tx(who, "commit_result", {"task_id": task_id, "segments_root": merkle_root(LEAVES[who.peer_id]),
                                           "result_hash": b"\x22" * 32, "segments": SEGMENTS}) for who in (W1, W2)]
    assert all(r.code == TxCode.OK for r in chain.block(txs).receipts)
    run_draws(chain)
    return task_id, chain.ledger.state.tasks[task_id]


def unavailable(chain, task_id, slot, verifier=None):
    verifier = verifier or slot["verifiers"][0]["verifier"]
    receipt = answer_slot(chain, task_id, slot["slot"], verifier, match=False,
                          evidence=unavailable_evidence(slot["salt"]))
    assert receipt.code == TxCode.OK
    return verifier


def respond(chain, worker, task_id, slot, segment=None, leaf=None):
    segment = slot["segment"] if segment is None else segment
    leaves = LEAVES[slot["worker"]]
    return chain.run(worker, "availability_response", {
        "task_id": task_id, "slot": slot["slot"], "leaf": leaf or leaves[slot["segment"]],
        "path": audit_path(leaves, segment)})


def finalize(chain, task_id):
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})


def stakes(chain):
    return {who.peer_id: chain.ledger.stake_info(who.peer_id)["bonded"] for who in (W1, W2, *VERIFIERS)}


def test_a_withholder_that_disputes_and_serves_the_referees_is_unpaid_and_nobody_honest_is_slashed():
    """Issue 24 item 3: withhold during the answer window, then dispute and serve the referees. Before
    ADR 0207 every "unavailable" verifier was contradicted by the referees and slashed and the withholder
    paid in full; now the dispute is refused (the slot is challenged), the withholder never answers the
    challenge (its plan was to dispute), and it is guilty of withholding: slashed and unpaid."""
    chain = make_chain()
    task_id, task = committed_task(chain)
    slot = slots_of(task, W1)[0]
    verifier = unavailable(chain, task_id, slot)
    receipt = chain.run(W1, "dispute", {"task_id": task_id, "slot": slot["slot"]})
    if receipt.code == TxCode.OK:   # the old ledger let it dispute; it serves the referees, who see a match
        run_scheduled_draws(chain, task_id)
        for referee in [r["referee"] for r in slot["referees"]]:
            vote(chain, task_id, slot["slot"], referee)
    answer_rest_honestly(chain, task_id, task)
    before = stakes(chain)
    chain.empty_blocks(4)   # the challenge window (dispute_s 3) passes
    finalize(chain, task_id)
    assert slashed(chain, verifier) == 0 and chain.ledger.stake_info(verifier)["bonded"] == before[verifier]
    assert task.payouts.get(W1.peer_id, 0) < WORKER_SHARE
    assert slashed(chain, W1) == before[W1.peer_id] * 1000 // 10_000
    assert slot["outcome"] == "guilty" and slot["verdict"]["withheld"]
    assert task.payouts.get(verifier, 0) >= POOL // 4   # paid for the audit
    assert task.payouts[W2.peer_id] >= WORKER_SHARE and slashed(chain, W2) == 0


def test_the_dispute_is_refused_and_an_unanswered_challenge_is_withholding():
    chain = make_chain()
    task_id, task = committed_task(chain)
    slot = slots_of(task, W1)[0]
    unavailable(chain, task_id, slot)
    assert slot["challenge"]["deadline"] > 0
    assert not slot["dispute_deadline"] and slot["verdict"] is None and task.status == "disputed"
    assert chain.run(W1, "dispute", {"task_id": task_id, "slot": slot["slot"]}).code == TxCode.BAD_STATE
    result = None
    while slot["outcome"] == "pending":
        result = chain.block()
    events = task_events(result)
    assert any(e["event"] == "availability_withheld" and e["slot"] == slot["slot"] for e in events)
    assert slot["outcome"] == "guilty"
    assert respond(chain, W1, task_id, slot).code == TxCode.BAD_STATE   # resolved: too late


def test_a_briefly_offline_worker_answers_the_challenge_and_loses_nothing():
    chain = make_chain(dispute_s=30)
    task_id, task = committed_task(chain)
    slot = slots_of(task, W1)[0]
    verifier = unavailable(chain, task_id, slot)
    assert slot["challenge"]["deadline"] and slot["verdict"] is None
    before = stakes(chain)
    # only the audited worker, with a leaf and path that prove the audited segment under its root
    assert respond(chain, W2, task_id, slot).code == TxCode.UNAUTHORIZED
    assert respond(chain, W1, task_id, slot, leaf=b"\x99" * 32).code == TxCode.BAD_PAYLOAD
    wrong = (slot["segment"] + 1) % SEGMENTS
    assert respond(chain, W1, task_id, slot, segment=wrong, leaf=LEAVES[W1.peer_id][wrong]).code == TxCode.BAD_PAYLOAD
    result = chain.block([chain.tx(W1, "availability_response", {
        "task_id": task_id, "slot": slot["slot"], "leaf": LEAVES[W1.peer_id][slot["segment"]],
        "path": audit_path(LEAVES[W1.peer_id], slot["segment"])})])
    assert result.receipts[0].code == TxCode.OK
    assert [e["event"] for e in task_events(result) if e.get("slot") == slot["slot"]][:2] == [
        "availability_answered", "audit_assigned"]
    entry = slot["verifiers"][0]
    assert entry["answer"] is None and entry["commitment"] is None and entry["set_aside"][0]["match"] is False
    assert entry["deadline"] == 1000 * (result.height + 30)   # a new answer window (audit_answer_s 30)
    assert respond(chain, W1, task_id, slot).code == TxCode.BAD_STATE   # no challenge open any more
    # asked again, the verifier fetches and finds the honest work
    assert answer_slot(chain, task_id, slot["slot"], verifier).code == TxCode.OK
    assert slot["outcome"] == "ok"
    answer_rest_honestly(chain, task_id, task)
    finalize(chain, task_id)
    assert task.payouts[W1.peer_id] >= WORKER_SHARE and slashed(chain, W1) == 0
    assert chain.ledger.stake_info(W1.peer_id)["bonded"] == before[W1.peer_id]
    assert slashed(chain, verifier) == 0 and task.payouts.get(verifier, 0) >= POOL // 4


@pytest.mark.parametrize("referees_find", ["match", "unavailable"])
def test_unavailable_again_after_a_response_goes_to_referees_and_is_never_slashed(referees_find):
    chain = make_chain(dispute_s=30)
    task_id, task = committed_task(chain)
    slot = slots_of(task, W1)[0]
    verifier = unavailable(chain, task_id, slot)
    assert respond(chain, W1, task_id, slot).code == TxCode.OK
    unavailable(chain, task_id, slot, verifier)   # still cannot fetch: one challenge per slot, then referees
    run_scheduled_draws(chain, task_id)
    assert not slot.get("challenge", {}).get("deadline") and len(slot["referees"]) == 3
    evidence = HONEST_EVIDENCE if referees_find == "match" else unavailable_evidence(slot["salt"])
    for referee in [r["referee"] for r in slot["referees"]]:
        vote(chain, task_id, slot["slot"], referee, match=referees_find == "match", evidence=evidence)
    answer_rest_honestly(chain, task_id, task)
    before = stakes(chain)
    finalize(chain, task_id)
    assert slashed(chain, verifier) == 0
    if referees_find == "match":
        assert slot["outcome"] == "ok" and task.payouts[W1.peer_id] >= WORKER_SHARE and slashed(chain, W1) == 0
        assert task.payouts.get(verifier, 0) < POOL // 4 or verifier in task.workers
    else:
        assert slot["outcome"] == "guilty" and task.payouts.get(W1.peer_id, 0) < WORKER_SHARE
        assert slashed(chain, W1) == before[W1.peer_id] * 1000 // 10_000
        assert task.payouts.get(verifier, 0) >= POOL // 4 // 4   # shares the slot with the referees


def test_an_unavailable_answer_beside_a_real_one_goes_to_referees_and_is_not_slashed():
    chain = make_chain(audit_double_bps=10_000)
    task_id, task = committed_task(chain)
    slot = slots_of(task, W1)[0]
    first, second = (v["verifier"] for v in slot["verifiers"])
    # the worker served only its friend: one match and one "unavailable" are answers that differ
    chain.block([chain.seal(identity_of(first), task_id, slot["slot"], True, HONEST_EVIDENCE, 0),
                 chain.seal(identity_of(second), task_id, slot["slot"], False, unavailable_evidence(slot["salt"]), 0)])
    chain.reveal_all(task_id)
    run_scheduled_draws(chain, task_id)
    assert not slot.get("challenge") and len(slot["referees"]) == 3
    for referee in [r["referee"] for r in slot["referees"]]:
        vote(chain, task_id, slot["slot"], referee)
    assert slot["outcome"] == "ok"
    answer_rest_honestly(chain, task_id, task)
    finalize(chain, task_id)
    assert slashed(chain, second) == 0 and slashed(chain, first) == 0


@pytest.mark.parametrize("payload", [
    {"leaf": b"\x01" * 31, "path": []}, {"leaf": b"\x01" * 32, "path": [b"\x02" * 32] * 33},
    {"leaf": b"\x01" * 32, "path": [b"\x02" * 31]}, {"leaf": b"\x01" * 32}, {"leaf": b"\x01" * 32, "path": b""},
])
def test_availability_response_payloads_are_checked(payload):
    with pytest.raises(TxError) as err:
        build_tx(W1, "dekube-test", 0, "availability_response", {"task_id": b"\x00" * 32, "slot": 0, **payload})
    assert err.value.code == TxCode.BAD_PAYLOAD


def test_a_challenged_and_reasked_slot_reloads_with_the_same_state():
    chain = make_chain(dispute_s=30)
    task_id, task = committed_task(chain)
    slot = slots_of(task, W1)[0]
    unavailable(chain, task_id, slot)
    assert Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items())).state.tasks[task_id] == task
    assert respond(chain, W1, task_id, slot).code == TxCode.OK
    replica = Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items()))
    assert replica.state.tasks[task_id] == task and replica.app_hash == chain.ledger.app_hash
    assert replica.state.tasks[task_id].slots[slot["slot"]]["verifiers"][0]["set_aside"]

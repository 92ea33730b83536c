"""Verifier answers are committed, then revealed (docs/adr/0202): a second verifier cannot copy the
first, a commitment never revealed is treated like silence (redrawn) and slashed, honest verifiers are
paid as before; what the node's SealedAnswers commits to is what the ledger accepts as its reveal."""
from test_audit_slots import OWNER, POOL, answer_rest_honestly, committed_task, make_chain, slashed
from test_ledger_kit import HONEST_EVIDENCE, identity_of, run_scheduled_draws

from consensus.state.answers import answer_commitment
from consensus.txcodes import TxCode
from ml.compute.sealed_answers import SealedAnswers
from ml.compute.verification_flow import Judgement

REVEAL_S = 5


def test_a_copier_can_neither_see_nor_reveal_another_verifiers_answer():
    chain = make_chain(audit_double_bps=10_000, audit_reveal_s=REVEAL_S)
    task_id, task, _ = committed_task(chain)
    slot = task.slots[0]
    honest, copier = (identity_of(v["verifier"]) for v in slot["verifiers"])
    chain.block([chain.seal(honest, task_id, slot["slot"], True, HONEST_EVIDENCE, 0)])
    assert slot["reveal_deadline"] == 0 and slot["verifiers"][0]["answer"] is None   # nothing public yet
    early = chain.run(honest, "audit_result", chain.sealed[(task_id, 0, honest.peer_id)][1])
    assert early.code == TxCode.BAD_STATE and "every verifier" in early.log
    copied = slot["verifiers"][0]["commitment"]                  # all the copier can see: a hash
    assert chain.run(copier, "audit_commit", {"task_id": task_id, "slot": 0, "commitment": copied}).code == TxCode.OK
    assert slot["reveal_deadline"] > 0                            # both committed: reveals open
    chain.reveal_all(task_id)                                     # the honest verifier reveals
    revealed = dict(chain.sealed[(task_id, 0, honest.peer_id)][1])   # now public: the copier replays it
    stolen = chain.run(copier, "audit_result", revealed)
    assert stolen.code == TxCode.BAD_PAYLOAD and "commitment" in stolen.log
    assert answer_commitment(task_id, 0, copier.peer_id, True, HONEST_EVIDENCE, 0, revealed["blinding"]) != copied
    late = chain.run(copier, "audit_commit", {"task_id": task_id, "slot": 0, "commitment": b"\x09" * 32})
    assert late.code == TxCode.ALREADY_KNOWN
    chain.empty_blocks(REVEAL_S + 1)
    assert slot["outcome"] == "ok" and slot["verifiers"][1].get("unrevealed") is True
    answer_rest_honestly(chain, task_id, task)
    bonded = chain.ledger.stake_info(copier.peer_id)["bonded"]
    chain.empty_blocks(3)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, copier) == bonded * 1000 // 10_000 and slashed(chain, honest) == 0
    assert task.payouts.get(honest.peer_id, 0) >= POOL // len(task.slots)
    assert task.payouts.get(copier.peer_id, 0) < POOL // len(task.slots) or copier.peer_id in task.workers


def test_a_commitment_never_revealed_is_redrawn_and_slashed():
    chain = make_chain(audit_reveal_s=REVEAL_S)
    task_id, task, _ = committed_task(chain)
    slot = task.slots[0]
    withholder = identity_of(slot["verifiers"][0]["verifier"])
    assert chain.block([chain.seal(withholder, task_id, 0, False, b"\xf0" * 32, 1)]).receipts[0].code == TxCode.OK
    assert slot["reveal_deadline"] > 0
    chain.empty_blocks(REVEAL_S + 1)                             # it never reveals: like a silent verifier
    run_scheduled_draws(chain, task_id)
    assert slot["outcome"] == "pending" and slot["verifiers"][0]["unrevealed"] is True
    assert len(slot["verifiers"]) == 2 and slot["verifiers"][1]["redraw"] is True
    assert chain.run(withholder, "audit_result", chain.sealed[(task_id, 0, withholder.peer_id)][1]).code \
        == TxCode.BAD_STATE                                       # too late, whatever it reveals now
    answer_rest_honestly(chain, task_id, task)
    assert slot["outcome"] == "ok"
    bonded = chain.ledger.stake_info(withholder.peer_id)["bonded"]
    chain.empty_blocks(3)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, withholder) == bonded * 1000 // 10_000
    replacement = slot["verifiers"][1]["verifier"]
    assert slashed(chain, replacement) == 0 and task.payouts.get(replacement, 0) >= POOL // len(task.slots)


def test_the_sealed_answer_is_what_the_ledger_accepts_as_the_reveal():
    chain = make_chain(audit_double_bps=10_000)
    task_id, task, _ = committed_task(chain)
    slot = task.slots[0]
    first, second = (identity_of(v["verifier"]) for v in slot["verifiers"])
    sealed = {who.peer_id: SealedAnswers(who) for who in (first, second)}
    honest = Judgement(True, HONEST_EVIDENCE, 0, "replayed")
    for who in (first, second):
        chain.ok(who, "audit_commit", sealed[who.peer_id].commit_payload(task_id, 0, honest))
    assert slot["reveal_deadline"] > 0
    forged = sealed[second.peer_id].reveal_payload(task_id, 0, Judgement(False, HONEST_EVIDENCE, 1, "changed mind"))
    assert chain.run(second, "audit_result", forged).code == TxCode.BAD_PAYLOAD
    for who in (first, second):
        chain.ok(who, "audit_result", sealed[who.peer_id].reveal_payload(task_id, 0, honest))
    assert slot["outcome"] == "ok"
    restarted = SealedAnswers(first)                             # a restart derives the same blinding
    assert restarted.blinding(task_id, 0) == sealed[first.peer_id].blinding(task_id, 0)

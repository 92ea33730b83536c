"""Verifier answers are committed, then revealed (docs/adr/0202): a second verifier cannot copy the
first, a commitment never revealed is treated like silence (redrawn) and slashed, honest verifiers are
paid as before."""
from test_audit_slots import OWNER, POOL, answer_rest_honestly, committed_task, make_chain, slashed
from test_ledger_kit import HONEST_EVIDENCE, identity_of, run_scheduled_draws

from consensus.state.answers import answer_commitment
from consensus.txcodes import TxCode

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

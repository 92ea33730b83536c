"""Referee votes are committed, then revealed (docs/adr/0210): a late referee cannot copy an earlier
one's vote, a sealed vote never revealed counts as no vote and is slashed, and what the node's
SealedAnswers commits to as a referee is what the ledger accepts as its vote."""
from test_audit_slots import (
    FAKE,
    OWNER,
    W1,
    answer_rest_honestly,
    committed_task,
    dispute,
    make_chain,
    slashed,
    slots_of,
)
from test_ledger_kit import HONEST_EVIDENCE, answer_slot, identity_of, run_scheduled_draws, run_until

from consensus.state.answers import vote_commitment
from consensus.txcodes import TxCode
from ml.compute.sealed_answers import SealedAnswers
from ml.compute.verification_flow import Judgement

REVEAL_S = 5


def _disputed(chain):
    """A task whose first slot of W1 a false accuser called a mismatch, disputed: 3 referees drawn."""
    task_id, task, _ = committed_task(chain)
    slot = slots_of(task, W1)[0]
    accuser = slot["verifiers"][0]["verifier"]
    answer_slot(chain, task_id, slot["slot"], accuser, match=False, evidence=FAKE, step=2)
    dispute(chain, W1, task_id, slot["slot"])
    assert len(slot["referees"]) == 3
    return task_id, task, slot, accuser


def test_a_late_referee_can_neither_see_nor_reveal_an_earlier_vote():
    chain = make_chain(audit_reveal_s=REVEAL_S)
    task_id, task, slot, accuser = _disputed(chain)
    first, second, copier = (identity_of(r["referee"]) for r in slot["referees"])
    chain.block([chain.seal_vote(who, task_id, slot["slot"], True, HONEST_EVIDENCE) for who in (first, second)])
    assert all(r["vote"] is None for r in slot["referees"]) and not slot.get("referee_reveal_deadline")
    early = chain.run(first, "referee_vote", chain.sealed[(task_id, slot["slot"], first.peer_id)][1])
    assert early.code == TxCode.BAD_STATE and "every referee" in early.log   # nothing public before all commit
    copied = slot["referees"][0]["commitment"]                   # all a late referee can see: a hash
    assert chain.run(copier, "referee_commit", {"task_id": task_id, "slot": slot["slot"],
                                                "commitment": copied}).code == TxCode.OK
    assert slot["referee_reveal_deadline"] > 0                   # all committed: the votes open
    chain.reveal_all(task_id)                                    # the two honest referees reveal
    assert slot["outcome"] == "pending"                          # the copier's seat is still sealed
    stolen = chain.run(copier, "referee_vote", dict(chain.sealed[(task_id, slot["slot"], first.peer_id)][1]))
    assert stolen.code == TxCode.BAD_PAYLOAD and "commitment" in stolen.log
    chain.empty_blocks(REVEAL_S + 1)
    assert slot["outcome"] == "ok" and slot["referees"][2]["unrevealed"] is True
    answer_rest_honestly(chain, task_id, task)
    bonded = chain.ledger.stake_info(copier.peer_id)["bonded"]
    chain.empty_blocks(3)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, copier) == bonded * 1000 // 10_000
    assert slashed(chain, first) == 0 and slashed(chain, second) == 0 and slashed(chain, accuser) > 0


def test_a_sealed_vote_never_revealed_is_no_vote_and_is_slashed():
    chain = make_chain(audit_reveal_s=REVEAL_S)
    task_id, task, slot, _ = _disputed(chain)
    answer_rest_honestly(chain, task_id, task)                   # the other slots, before their deadlines
    honest, withholder, silent = (identity_of(r["referee"]) for r in slot["referees"])
    chain.block([chain.seal_vote(honest, task_id, slot["slot"], True, HONEST_EVIDENCE),
                 chain.seal_vote(withholder, task_id, slot["slot"], True, HONEST_EVIDENCE)])
    run_until(chain, lambda: slot.get("referee_reveal_deadline"))   # the silent referee's deadline passes
    chain.block([chain.tx(honest, "referee_vote", chain.sealed[(task_id, slot["slot"], honest.peer_id)][1])])
    chain.empty_blocks(REVEAL_S + 1)                             # the withholder never reveals
    run_scheduled_draws(chain, task_id)
    assert slot["referees"][1]["unrevealed"] is True and slot["referees"][1]["vote"] is None
    assert slot["outcome"] == "pending" and len(slot["referees"]) > 3    # one vote of three: a larger panel
    late = chain.run(withholder, "referee_vote", chain.sealed[(task_id, slot["slot"], withholder.peer_id)][1])
    assert late.code == TxCode.BAD_STATE
    again = chain.run(withholder, "referee_commit",
                      {"task_id": task_id, "slot": slot["slot"], "commitment": b"\x01" * 32})
    assert again.code == TxCode.ALREADY_KNOWN                    # one sealed vote per seat
    for entry in slot["referees"]:
        if entry["vote"] is None and not entry.get("unrevealed") and entry["referee"] != silent.peer_id:
            chain.block([chain.seal_vote(identity_of(entry["referee"]), task_id, slot["slot"], True, HONEST_EVIDENCE)])
    run_until(chain, lambda: slot.get("referee_reveal_deadline"))
    chain.reveal_all(task_id)
    assert slot["outcome"] == "ok"
    bonded = chain.ledger.stake_info(withholder.peer_id)["bonded"]
    chain.empty_blocks(3)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, withholder) == bonded * 1000 // 10_000
    assert slashed(chain, honest) == 0 and slashed(chain, silent) == 0     # silence is not a false vote


def test_the_sealed_vote_is_what_the_ledger_accepts_and_binds_the_panel():
    chain = make_chain()
    task_id, task, slot, _ = _disputed(chain)
    referees = [identity_of(r["referee"]) for r in slot["referees"]]
    sealed = {who.peer_id: SealedAnswers(who) for who in referees}
    honest = Judgement(True, HONEST_EVIDENCE, 0, "replayed")
    for who in referees:
        chain.ok(who, "referee_commit", sealed[who.peer_id].vote_commit_payload(task_id, slot["slot"], 0, honest))
    forged = sealed[referees[0].peer_id].vote_reveal_payload(task_id, slot["slot"],
                                                             Judgement(False, FAKE, 2, "changed mind"))
    assert chain.run(referees[0], "referee_vote", forged).code == TxCode.BAD_PAYLOAD
    for who in referees:
        chain.ok(who, "referee_vote", sealed[who.peer_id].vote_reveal_payload(task_id, slot["slot"], honest))
    assert slot["outcome"] == "ok"
    me = sealed[referees[0].peer_id]
    blinding = me.vote_reveal_payload(task_id, slot["slot"], honest)["blinding"]
    assert blinding != me.blinding(task_id, slot["slot"])        # a vote's blinding is not an answer's
    assert vote_commitment(task_id, slot["slot"], referees[0].peer_id, 1, True, HONEST_EVIDENCE, blinding) \
        != slot["referees"][0]["commitment"]                     # the panel is bound in

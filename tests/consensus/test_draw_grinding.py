"""A proposer that grinds its blocks cannot steer the audit draws (issue 24 item 4, docs/adr/0202).

The grinding attacker proposes the block that closes a task's commit phase (and every block after it):
offline it tries many block times and transaction orders, replays each candidate chain and keeps the one
whose draw spares its cheating co-conspirator (a worker that faked 3 of 4 segments) or gives a disputed
slot colluding referees. Before ADR 0202 the draws hashed the closing (or disputing) block's hash, which
those choices change: the attacker found a clean draw within a few dozen tries. With the beacon, the
draw comes from VRF outputs that the block's time and transactions do not enter: every candidate chain
draws the same, so grinding adds nothing to what an honest proposer's chain gives."""
import copy

from test_audit_slots import OWNER, SEGMENTS, W1, W2, commit, make_chain, submit
from test_ledger_kit import answer_slot

TRIES = 40
FAKED = {1, 2, 3}          # the cheater computed only segment 0


def _draws_done(chain, task_id):
    """Blocks until no slot of the task waits for a scheduled draw (none before ADR 0202)."""
    while any(slot.get("draw") for slot in chain.ledger.state.tasks[task_id].slots):
        chain.block()


def _ground_chain(base, task_id, closing_txs, try_index):
    """One candidate: the closing block at another time, with the transactions in another order, then the
    blocks up to the draw, each at a time of the attacker's choosing."""
    chain = copy.deepcopy(base)
    chain.block_ms = 1000 + 37 * try_index                    # any time the validators accept
    chain.block(closing_txs if try_index % 2 else list(reversed(closing_txs)))
    chain.block_ms = 1000 + 11 * try_index
    _draws_done(chain, task_id)
    return chain


def _cheater_draw(chain, task_id):
    task = chain.ledger.state.tasks[task_id]
    return tuple((slot["segment"], tuple(v["verifier"] for v in slot["verifiers"]))
                 for slot in task.slots if slot["worker"] == W2.peer_id)


def test_grinding_the_closing_block_does_not_change_the_audit_draw():
    base = make_chain()
    task_id = submit(base)
    commit(base, W1, task_id)
    closing = [base.tx(W2, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                             "result_hash": b"\x22" * 32, "segments": SEGMENTS}),
               base.tx(OWNER, "transfer", {"to": W1.peer_id, "amount": 1})]
    base.nonces.clear()
    draws = [_cheater_draw(_ground_chain(base, task_id, closing, i), task_id) for i in range(TRIES)]
    escapes = [i for i, draw in enumerate(draws) if not {segment for segment, _ in draw} & FAKED]
    honest = draws[0]                                        # what the first (ungrounded) chain draws
    assert len(set(draws)) == 1, f"{len(set(draws))} different draws in {TRIES} tries; escapes at {escapes}"
    assert len(escapes) in (0, TRIES)                        # grinding changes nothing: 0 extra success
    assert all(segment in range(SEGMENTS) for segment, _ in honest)


def test_grinding_the_dispute_block_does_not_change_the_referee_panel():
    base = make_chain()
    task_id = submit(base)
    commit(base, W1, task_id)
    commit(base, W2, task_id)
    _draws_done(base, task_id)
    task = base.ledger.state.tasks[task_id]
    slot = next(s for s in task.slots if s["worker"] == W2.peer_id)
    verifier = slot["verifiers"][0]["verifier"]
    answer_slot(base, task_id, slot["slot"], verifier, match=False, step=1)   # the cheater was caught
    _draws_done(base, task_id)
    dispute = [base.tx(W2, "dispute", {"task_id": task_id, "slot": slot["slot"]})]
    base.nonces.clear()
    panels = set()
    for i in range(TRIES):
        chain = _ground_chain(base, task_id, dispute, i)
        ground = chain.ledger.state.tasks[task_id].slots[slot["slot"]]
        panels.add(tuple(sorted(r["referee"] for r in ground["referees"])))
    assert len(panels) == 1, f"the disputing proposer chose among {len(panels)} referee panels"
    assert len(next(iter(panels))) == 3

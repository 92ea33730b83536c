"""The node's side of committed-then-revealed audit answers (docs/adr/0202): which duty a verifier has in
each phase of its slot (tests/consensus/test_answer_commit_reveal.py checks ml/compute/sealed_answers.py
against the ledger)."""
from consensus.task_info import TaskInfo
from ml.compute.duties import AUDIT, REVEAL, duties_for


def test_a_verifier_commits_then_reveals_and_never_twice():
    entry = {"verifier": "v", "deadline": 10, "commitment": None, "answer": None}
    slot = {"slot": 0, "worker": "w", "segment": 1, "salt": "ab" * 32, "outcome": "pending", "verifiers": [entry],
            "reveal_deadline": 0, "dispute_deadline": 0, "referees": []}
    doc = {"task_id": "11" * 32, "slots": [slot]}
    assert [d.kind for d in duties_for(TaskInfo.from_json(doc), "v", 5)] == [AUDIT]
    entry["commitment"] = "cc" * 32
    assert duties_for(TaskInfo.from_json(doc), "v", 5) == []     # committed: wait for the reveals
    slot["reveal_deadline"] = 20
    assert [(d.kind, d.deadline) for d in duties_for(TaskInfo.from_json(doc), "v", 12)] == [(REVEAL, 20)]
    assert duties_for(TaskInfo.from_json(doc), "v", 21) == []    # the reveal window closed
    entry["unrevealed"] = True
    assert duties_for(TaskInfo.from_json(doc), "v", 12) == []

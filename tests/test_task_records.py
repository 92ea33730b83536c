"""Typed ledger records across the layers (issue 20, docs/adr/0200), checked statically over ml/ and cli/.

A task or audit slot read above consensus is a `consensus.task_info.TaskInfo` / `AuditSlot` that the
one decoder (`TaskInfo.from_json`) made, so a change to a slot's shape breaks at one place instead of
three readers at run time. Two rules, read with ``ast`` from every .py file of ml/ and cli/:

- no string-keyed access (``x["key"]`` or ``x.get("key")``) on a name that says it holds a task or a
  slot (``task``, ``tasks[i]``, ``slot``, ``self.task``, ...);
- no string literal that is a task status or a slot outcome (`TaskStatus`, `SlotOutcome`), but for the
  few places listed in ``OTHER_MEANINGS`` where the same word means something else (docstrings are
  prose and not read).

And the decoder itself: it reads the ledger's own documents and refuses malformed ones with the
field's name.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from consensus.state.audits import advance_task
from consensus.state.ledger import task_json
from consensus.state.records import SlotOutcome, Task, TaskStatus
from consensus.task_info import AuditSlot, TaskDocError, TaskInfo

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ml", "cli")
STATUS_WORDS = frozenset(v for cls in (TaskStatus, SlotOutcome) for k, v in vars(cls).items()
                         if k.isupper() and isinstance(v, str))
# (file, literal): the same word meaning something other than a task status or a slot outcome
OTHER_MEANINGS = {
    ("ml/compute/job_board.py", "committed"), ("ml/compute/job_board.py", "failed"),   # JobState: our share
    ("ml/compute/job_board.py", "rejected"),
    ("ml/serve/claimable.py", "paid"),            # serving receipts the ledger will pay
    ("cli/serve.py", "ok"),                      # a serving check's result
    ("cli/wallet.py", "pending"),                # the block tag of dkb_getTransactionCount
    ("cli/testnet.py", "running"),                # a local process's state
    ("cli/testnet.py", "stopped"),                # ... (a task's "stopped" is ADR 0211's)
    ("cli/dev_chain.py", "created"),              # "created dev chain ..." (a message)
}


def _holder_name(node: ast.expr) -> str:
    """The name a subscript or .get() is applied to: ``task`` for task, self.task, tasks[0], task.x."""
    while isinstance(node, (ast.Subscript, ast.Call)):
        node = node.value if isinstance(node, ast.Subscript) else node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _says_task_or_slot(name: str) -> bool:
    """``task``, ``tasks``, ``slot``, ``old_task``...; not ``task_spec`` (the owner's spec map)."""
    lowered = name.lower()
    return ("task" in lowered or "slot" in lowered) and "spec" not in lowered


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def violations(root: Path = REPO_ROOT) -> list[str]:
    """Every string-keyed task/slot access and stray status literal under ml/ and cli/ of ``root``."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(), rel)
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                where = f"{rel}:{getattr(node, 'lineno', '?')}"
                if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                        and isinstance(node.slice.value, str) and _says_task_or_slot(_holder_name(node.value))):
                    found.append(f"{where}: {ast.unparse(node)}")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                      and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                      and _says_task_or_slot(_holder_name(node.func.value))):
                    found.append(f"{where}: {ast.unparse(node)}")
                elif (isinstance(node, ast.Constant) and node.value in STATUS_WORDS and id(node) not in skip
                      and (rel, node.value) not in OTHER_MEANINGS):
                    found.append(f"{where}: status literal {node.value!r}")
    return found


def test_ml_and_cli_read_tasks_and_slots_through_the_decoder_only():
    found = violations()
    assert not found, "read a task or slot as consensus.task_info.TaskInfo, statuses as TaskStatus/SlotOutcome:\n" \
        + "\n".join(found)


def test_every_other_meaning_is_still_there():
    """An OTHER_MEANINGS entry whose literal is gone is stale: the list shrinks with the code."""
    for rel, word in OTHER_MEANINGS:
        tree = ast.parse((REPO_ROOT / rel).read_text())
        assert any(isinstance(n, ast.Constant) and n.value == word for n in ast.walk(tree)), (rel, word)


def test_the_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "ml").mkdir()
    (tmp_path / "cli").mkdir()
    (tmp_path / "ml" / "a.py").write_text(
        '"""doc: "paid" here is prose."""\n'
        'def f(task, slots, job):\n'
        '    return task["status"], slots[0].get("outcome"), job["state"], "pending"\n')
    (tmp_path / "cli" / "b.py").write_text('def g(self):\n    return self.task.get("reason")\n')
    found = violations(tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "task['status']", "slots[0].get('outcome')", "status literal 'pending'", "self.task.get('reason')"]


# ---- the decoder ---------------------------------------------------------------------------------

def _ledger_task() -> tuple[bytes, Task]:
    task = Task("owner-peer", 3, {"model": "digits-mlp", "segments": 2}, 100, 5, sources=["/ip4/1.2.3.4/tcp/1"])
    task.status = TaskStatus.DISPUTED
    task.workers = ["w1", "w2"]
    task.commits = {"w1": [b"\x01" * 32, b"\x02" * 32, 2, 9]}
    task.rejections = {"w2": "Untrainable: x"}
    task.payouts = {"w1": 7}
    task.segments = 2
    task.slots = [{"slot": 0, "worker": "w1", "segment": 1, "salt": b"\xab" * 32,
                   "verifiers": [{"verifier": "v1", "deadline": 50, "redraw": False,
                                  "answer": {"match": False, "evidence": b"\xee" * 32, "step": 3}}],
                   "dispute_deadline": 60, "dispute": {"height": 12},
                   "referees": [{"referee": "r1", "vote": None, "panel": 0}], "referee_deadline": 80,
                   "verdict": None, "outcome": SlotOutcome.PENDING}]
    return b"\x11" * 32, task


def test_the_decoder_reads_the_ledgers_own_document():
    task_id, record = _ledger_task()
    info = TaskInfo.from_json(task_json(task_id, record, 1234))
    assert info.task_id == task_id.hex() and info.status == TaskStatus.DISPUTED and info.block_time_ms == 1234
    assert info.workers == ("w1", "w2") and info.commits["w1"].segments == 2 and info.commits["w1"].height == 9
    assert info.commits["w1"].result == (b"\x02" * 32).hex() and info.rejections == {"w2": "Untrainable: x"}
    [slot] = info.slots
    assert isinstance(slot, AuditSlot) and slot.pending and slot.salt == b"\xab" * 32 and slot.disputed
    assert slot.dispute_height == 12 and slot.verifiers[0].answer.key == (False, "ee" * 32)
    assert slot.verifiers[0].answer.step == 3 and slot.referees[0].vote is None
    assert slot.deadlines() == [51, 62, 82] and info.parties == ("v1", "r1")
    assert info.spec_field("model") == "digits-mlp" and info.doc["task_id"] == task_id.hex()


def test_the_decoder_reads_sealed_answers_pending_draws_and_epochs():
    """The keys ADR 0202 (commitment, unrevealed, replaced, reveal_deadline, draw) and ADR 0203 (epochs)
    added to the ledger's document."""
    task_id, record = _ledger_task()
    slot = record.slots[0]
    slot["verifiers"][0].update(commitment=b"\xcc" * 32, unrevealed=True, replaced=True)
    slot["verifiers"].append({"verifier": "v2", "deadline": 70, "commitment": b"\xdd" * 32, "answer": None,
                              "redraw": True})
    slot["reveal_deadline"] = 90
    record.slots.append({**slot, "slot": 1, "verifiers": [], "salt": b"", "referees": [], "dispute": None,
                         "dispute_deadline": 0, "referee_deadline": 0, "reveal_deadline": 0,
                         "draw": {"kind": "open", "at": 14, "count": 0}})
    record.epochs = {"current": 1, "commits": {"w1": [[b"\x01" * 32, b"\x03" * 32, 1, 7]]}, "stopped": 1}
    info = TaskInfo.from_json(task_json(task_id, record, 1234))
    first, drawing = info.slots
    assert first.verifiers[0].commitment == "cc" * 32 and first.verifiers[0].unrevealed
    assert first.verifiers[0].replaced and not first.verifiers[0].sealed
    assert first.verifiers[1].sealed and first.verifiers[1].redraw and not first.verifiers[1].replaced
    assert first.reveal_deadline == 90 and first.draw is None and first.deadlines() == [51, 71, 62, 82, 92]
    assert drawing.draw is not None and (drawing.draw.kind, drawing.draw.at) == ("open", 14) and drawing.salt == b""
    assert info.epochs is not None and info.epochs.current == 1 and info.epochs.stopped == 1
    [progress] = info.epochs.of("w1")
    assert progress.state_digest == "03" * 32 and progress.segments == 1 and info.epochs.of("w2") == ()
    assert TaskInfo.from_json(task_json(task_id, _ledger_task()[1], 1)).epochs is None   # a task without epochs


def test_an_old_record_decodes_with_the_ledgers_defaults():
    info = TaskInfo.from_json({"task_id": "aa", "status": TaskStatus.PAID})
    assert info.slots == () and info.segments == 0 and info.device == "cpu" and info.commits == {}


def test_the_decoder_reads_an_availability_challenge():
    doc = {"slots": [{"slot": 2, "challenge": {"deadline": 9000, "responses": 1}, "dispute_deadline": 500,
                      "verifiers": [{"verifier": "v1", "deadline": 100,
                                     "set_aside": [{"match": False, "evidence": "aa"}]}],
                      "verdict": {"match": False, "evidence": "aa", "withheld": True}}]}
    [slot] = TaskInfo.from_json(doc).slots
    assert slot.challenge is not None and slot.challenge.open and slot.challenge.responses == 1
    assert slot.challenge_deadline == 9000 and 9001 + 1 in slot.deadlines()
    assert slot.verifiers[0].set_aside[0].key == (False, "aa") and slot.verifiers[0].rounds == 1
    assert slot.verdict is not None and slot.verdict.withheld
    closed = TaskInfo.from_json({"slots": [{"challenge": {"deadline": 0, "responses": 1}}]}).slots[0]
    assert closed.challenge is not None and not closed.challenge.open and closed.challenge_deadline == 0
    assert TaskInfo.from_json({"slots": [{}]}).slots[0].challenge is None


@pytest.mark.parametrize("doc, field", [
    ([], "task"),
    ({"status": 3}, "task.status"),
    ({"workers": "w1"}, "task.workers"),
    ({"workers": ["w1", 2]}, "task.workers"),
    ({"commits": {"w1": ["aa", "bb", 1]}}, "task.commits['w1']"),
    ({"payouts": {"w1": "7"}}, "task.payouts['w1']"),
    ({"price": True}, "task.price"),
    ({"slots": [None]}, "task.slots[0]"),
    ({"slots": [{"salt": "zz"}]}, "task.slots[0].salt"),
    ({"slots": [{"slot": "x"}]}, "task.slots[0].slot"),
    ({"slots": [{"verifiers": [{"answer": "yes"}]}]}, "task.slots[0].verifiers.answer"),
    ({"slots": [{"dispute": 5}]}, "task.slots[0].dispute"),
    ({"slots": [{"verifiers": [{"commitment": 5}]}]}, "task.slots[0].verifiers.commitment"),
    ({"slots": [{"verifiers": [{"unrevealed": "yes"}]}]}, "task.slots[0].verifiers.unrevealed"),
    ({"slots": [{"reveal_deadline": "soon"}]}, "task.slots[0].reveal_deadline"),
    ({"slots": [{"draw": ["open"]}]}, "task.slots[0].draw"),
    ({"slots": [{"draw": {"kind": "open", "at": "x"}}]}, "task.slots[0].draw.at"),
    ({"slots": [{"challenge": "x"}]}, "task.slots[0].challenge"),
    ({"slots": [{"challenge": {"deadline": True}}]}, "task.slots[0].challenge.deadline"),
    ({"slots": [{"challenge": {"deadline": 5, "responses": "1"}}]}, "task.slots[0].challenge.responses"),
    ({"slots": [{"verifiers": [{"set_aside": {}}]}]}, "task.slots[0].verifiers.set_aside"),
    ({"slots": [{"verifiers": [{"set_aside": [None]}]}]}, "task.slots[0].verifiers.set_aside[0]"),
    ({"slots": [{"verifiers": [{"set_aside": ["no"]}]}]}, "task.slots[0].verifiers.set_aside[0]"),
    ({"slots": [{"verdict": {"match": False, "withheld": "yes"}}]}, "task.slots[0].verdict.withheld"),
    ({"epochs": []}, "task.epochs"),
    ({"epochs": {"current": True}}, "task.epochs.current"),
    ({"epochs": {"stopped": False}}, "task.epochs.stopped"),
    ({"epochs": {"commits": {"w1": "x"}}}, "task.epochs.commits['w1']"),
    ({"epochs": {"commits": {"w1": [["aa", "bb", 1]]}}}, "task.epochs.commits['w1'][0]"),
])
def test_a_malformed_document_is_refused_with_the_field(doc, field):
    with pytest.raises(TaskDocError) as caught:
        TaskInfo.from_json(doc)
    assert str(caught.value).startswith(field)


def test_slot_outcome_is_defined_once():
    """consensus/state/audits.py names the outcomes from SlotOutcome (the one definition of "pending")."""
    import consensus.state.audits as audits

    assert (audits.PENDING, audits.OK, audits.GUILTY) == (SlotOutcome.PENDING, SlotOutcome.OK, SlotOutcome.GUILTY)
    assert callable(advance_task)

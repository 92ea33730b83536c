"""Availability challenges (docs/adr/0207): "I could not fetch" is a question for the worker, never a
slashable answer of the verifier.

A verifier that cannot get the audited worker's record or state answers ``unavailable_evidence`` of the
slot's salt (consensus/state/epochs.py) with match false. When every revealed answer of a slot says so
(and the worker did not leave a task cut into epochs, which ends the slot unaudited, ADR 0203), the slot
is ``challenged``: the worker has ``dispute_s`` (``challenge["deadline"]``) to send
``availability_response`` with the Merkle leaf of the audited segment's record and its audit path
against the ``segments_root`` it committed, which proves that it still holds its records and is back
on the network. Then the slot's verifiers are asked again, with new answer deadlines (one silent again
is redrawn as usual) and their earlier "unavailable" kept aside, neither paid nor slashed. A worker
that does not respond in time is guilty of withholding (unless it left the crew of a task cut into
epochs: then the slot waits until the ledger knows, and a worker that commits again is guilty, one that
left is unaudited, ADR 0230): the verdict is the unavailable answer
(``withheld``), it is slashed and unpaid like any guilty worker, and the verifiers who said so are
paid. A worker answers one challenge per slot: if its verifiers again all say unavailable, referees
are drawn and try to fetch; their verdict decides (unavailable: guilty of withholding). A mix of
unavailable and real answers goes to referees as answers that differ always did. An unavailable
answer or referee vote is never counted as contradicted by the verdict (``is_unavailable``).
Pure handlers of the ledger; the audit state machine (consensus/state/audits.py) calls ``open_challenge``,
``expire_challenge``, ``challenge_open`` and ``is_unavailable``.
"""
from __future__ import annotations

from typing import Any

from consensus.genesis import Params
from consensus.state import audits, deadlines
from consensus.state.context import BlockContext
from consensus.state.epochs import unavailable_evidence
from consensus.state.store import TASK, LedgerState
from consensus.tx import Tx
from consensus.txcodes import TxCode, TxError
from node.merkle import root_from_path

MAX_CHALLENGES = 1   # responses a worker may give per slot; afterwards referees try to fetch

Slot = dict[str, Any]


def is_unavailable(slot: Slot, answer: dict[str, Any] | None) -> bool:
    """Whether ``answer`` (a verifier answer or a referee vote) says the worker's data could not be had."""
    return (answer is not None and not answer["match"]
            and answer["evidence"] == unavailable_evidence(slot["salt"]))


def challenge_open(slot: Slot) -> bool:
    """Whether ``slot`` waits for its worker's ``availability_response``."""
    return bool((slot.get("challenge") or {}).get("deadline"))


def open_challenge(state: LedgerState, params: Params, ctx: BlockContext, task_id: bytes, slot: Slot) -> bool:
    """Every revealed answer of ``slot`` says unavailable: challenge the worker (True), or, once it has
    answered ``MAX_CHALLENGES`` challenges, leave it to referees (False: the caller draws them)."""
    challenge = slot.get("challenge") or {"deadline": 0, "responses": 0}
    if challenge["responses"] >= MAX_CHALLENGES:
        return False
    challenge["deadline"] = deadlines.dispute_deadline(params, ctx)
    slot["challenge"] = challenge
    state.events.append({"type": "availability_challenged", "task_id": task_id, "slot": slot["slot"],
                         "worker": slot["worker"], "segment": slot["segment"], "deadline": challenge["deadline"]})
    return True


def expire_challenge(state: LedgerState, task_id: bytes, slot: Slot) -> None:
    """The challenge deadline passed without a response: the worker withheld; the verdict is the
    unavailable answer (its verifiers are paid for it) and the slot is guilty."""
    slot["challenge"]["deadline"] = 0
    slot["verdict"] = {"match": False, "evidence": unavailable_evidence(slot["salt"]), "withheld": True}
    slot["outcome"] = audits.GUILTY
    state.events.append({"type": "availability_withheld", "task_id": task_id, "slot": slot["slot"],
                         "worker": slot["worker"]})


def close_challenge(state: LedgerState, task_id: bytes, slot: Slot) -> None:
    """The challenge deadline passed, but the worker has left the crew of a task cut into epochs (it
    crashed or was cut off, ADR 0203, 0230): no verdict of withholding; the caller ends the slot
    unaudited."""
    slot["challenge"]["deadline"] = 0
    state.events.append({"type": "availability_unanswered", "task_id": task_id, "slot": slot["slot"],
                         "worker": slot["worker"], "left_crew": True})


def _reask(params: Params, ctx: BlockContext, task: Any, slot: Slot) -> list[str]:
    """Every verifier that revealed an answer is asked again with a new deadline; its earlier answer
    (unavailable) is kept aside. Returns who was asked."""
    deadline = deadlines.answer_deadline(params, ctx, task)
    asked = []
    for v in slot["verifiers"]:
        if v["answer"] is not None:
            v.setdefault("set_aside", []).append(v["answer"])
            v.update({"commitment": None, "answer": None, "deadline": deadline})
            asked.append(v["verifier"])
    return asked


def apply_availability_response(state: LedgerState, params: Params, ctx: BlockContext, tx: Tx) -> None:
    """The challenged worker proves it holds the audited segment's record (its leaf and audit path
    against its committed segments_root) before the challenge deadline: its verifiers are asked again."""
    p = tx.payload
    task, slot = audits.slot_of(state, tx)
    if tx.sender != slot["worker"]:
        raise TxError(TxCode.UNAUTHORIZED, "only the audited worker can answer its availability challenge")
    if not challenge_open(slot):
        raise TxError(TxCode.BAD_STATE, f"slot {p['slot']} has no open availability challenge")
    if deadlines.passed(slot["challenge"]["deadline"], ctx):
        raise TxError(TxCode.BAD_STATE, f"the challenge deadline (block time {slot['challenge']['deadline']} ms) "
                                        "has passed")
    commit = slot["commit"]   # the commitment the slot audits: an epoch's, or the result (ADR 0230)
    if root_from_path(p["leaf"], slot["segment"] - commit["first"], commit["segments"] - commit["first"],
                      p["path"]) != commit["root"]:
        raise TxError(TxCode.BAD_PAYLOAD, f"the leaf and path do not prove segment {slot['segment']} "
                                          "under the committed segments_root")
    slot["challenge"] = {"deadline": 0, "responses": slot["challenge"]["responses"] + 1}
    asked = _reask(params, ctx, task, slot)
    state.touch(TASK, p["task_id"])
    state.events.append({"type": "availability_answered", "task_id": p["task_id"], "slot": p["slot"],
                         "worker": tx.sender, "segment": slot["segment"], "leaf": p["leaf"]})
    state.events.append({"type": "audit_assigned", "task_id": p["task_id"], "slot": p["slot"],
                         "worker": slot["worker"], "segment": slot["segment"], "verifiers": asked,
                         "salt": slot["salt"], "deadline": next(v["deadline"] for v in slot["verifiers"]
                                                                  if v["verifier"] in asked),
                         "reask": True})

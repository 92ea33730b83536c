"""What a compute node owes a task's verification, read from the task as the ledger shows it.

The ledger draws the parties of every audit slot (docs/adr/0168): the verifiers that must replay a
worker's segment, the worker that may dispute a mismatch, the referees that settle a dispute. This
module is the pure part of the node's side: given a `dkb_getTask` document, this node's peer id and the
ledger's time (block time in ms: the deadlines are block times, docs/adr/0187), `duties_for` lists what
the node still has to send (an audit answer's commitment, then its reveal once the slot's reveal window
opens, docs/adr/0202; a dispute; a referee vote), with nothing done twice and
nothing sent after its deadline. The compute role runs them (ml/compute/verification_flow.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

AUDIT, REVEAL, DISPUTE, REFEREE = "audit", "reveal", "dispute", "referee"   # audit: commit the answer
PENDING = "pending"     # a slot still being decided (consensus/state/audits.py)


@dataclass(frozen=True)
class Duty:
    kind: str          # audit (commit the answer) | reveal (open it) | dispute | referee
    task_id: str       # hex
    slot: int
    worker: str        # the audited worker
    segment: int
    salt: bytes
    deadline: int      # last block time (ms) at which the answer counts (0: none given)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.kind, self.task_id, self.slot


def _duty(task_id: str, slot: int, worker: str, segment: int, salt: bytes, kind: str, deadline: int) -> Duty:
    return Duty(kind, task_id, slot, worker, segment, salt, deadline)


def _deadline(entry: dict, *names: str) -> int:
    for name in names:
        value = entry.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _open(deadline: int, now_ms: int) -> bool:
    return deadline == 0 or now_ms <= deadline


def duties_for(task: dict, me: str, now_ms: int) -> list[Duty]:
    """The verification messages `me` still owes `task` at block time `now_ms`, in slot order."""
    out: list[Duty] = []
    task_id = str(task.get("task_id", ""))
    for slot in task.get("slots") or []:
        if not isinstance(slot, dict) or slot.get("outcome") not in (None, PENDING):
            continue
        try:
            index, worker = int(slot["slot"]), str(slot["worker"])
            segment, salt = int(slot["segment"]), bytes.fromhex(slot["salt"])
        except (KeyError, TypeError, ValueError):
            continue
        duty = functools.partial(_duty, task_id, index, worker, segment, salt)

        verifiers = [v for v in slot.get("verifiers") or [] if isinstance(v, dict)]
        reveal_deadline = _deadline(slot, "reveal_deadline")
        for entry in verifiers:
            if entry.get("verifier") != me or entry.get("answer") is not None or entry.get("unrevealed"):
                continue
            deadline = _deadline(entry, "deadline")
            if entry.get("commitment") is None and not reveal_deadline and _open(deadline, now_ms):
                out.append(duty(AUDIT, deadline))
            elif entry.get("commitment") is not None and reveal_deadline and now_ms <= reveal_deadline:
                out.append(duty(REVEAL, reveal_deadline))
        # the ledger opens a dispute window (dispute_deadline) once the slot's verifiers agree on a mismatch
        dispute_deadline = _deadline(slot, "dispute_deadline")
        if (worker == me and dispute_deadline and not slot.get("dispute") and not slot.get("referees")
                and now_ms <= dispute_deadline):
            out.append(duty(DISPUTE, dispute_deadline))
        for entry in slot.get("referees") or []:
            if not isinstance(entry, dict):
                continue
            deadline = _deadline(entry, "deadline") or _deadline(slot, "referee_deadline")
            if entry.get("referee") == me and entry.get("vote") is None and _open(deadline, now_ms):
                out.append(duty(REFEREE, deadline))
    return out

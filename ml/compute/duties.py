"""What a compute node owes a task's verification, read from the task as the ledger shows it.

The ledger draws the parties of every audit slot (docs/adr/0168): the verifiers that must replay a
worker's segment, the worker that may dispute a mismatch, the referees that settle a dispute. This
module is the pure part of the node's side: given a task (`consensus.task_info.TaskInfo`), this node's
peer id and the ledger's time (block time in ms: the deadlines are block times, docs/adr/0187), `duties_for` lists what
the node still has to send (an audit answer's commitment, then its reveal once the slot's reveal window
opens, docs/adr/0202; a dispute; a referee vote's commitment, then its reveal, docs/adr/0210), with
nothing done twice and nothing sent after its deadline. The compute role runs them (ml/compute/verification_flow.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from consensus.task_info import AuditSlot, TaskInfo

# audit / referee: commit the answer / the vote; reveal / referee_reveal: open it (docs/adr/0202, 0210)
AUDIT, REVEAL, DISPUTE, REFEREE, REFEREE_REVEAL = "audit", "reveal", "dispute", "referee", "referee_reveal"


@dataclass(frozen=True)
class Duty:
    kind: str          # audit | reveal | dispute | referee (commit the vote) | referee_reveal (open it)
    task_id: str       # hex
    slot: int
    worker: str        # the audited worker
    segment: int
    salt: bytes
    deadline: int      # last block time (ms) at which the answer counts (0: none given)

    @property
    def key(self) -> tuple[str, str, int]:
        return self.kind, self.task_id, self.slot


def _open(deadline: int, now_ms: int) -> bool:
    return deadline == 0 or now_ms <= deadline


def _slot_duties(task_id: str, slot: AuditSlot, me: str, now_ms: int) -> list[Duty]:
    def duty(kind: str, deadline: int) -> Duty:
        return Duty(kind, task_id, slot.slot, slot.worker, slot.segment, slot.salt, deadline)

    out = []
    for v in slot.verifiers:
        if v.verifier != me or v.answer is not None or v.unrevealed:
            continue
        if v.commitment is None and not slot.reveal_deadline and _open(v.deadline, now_ms):
            out.append(duty(AUDIT, v.deadline))
        elif v.commitment is not None and slot.reveal_deadline and now_ms <= slot.reveal_deadline:
            out.append(duty(REVEAL, slot.reveal_deadline))
    # the ledger opens a dispute window (dispute_deadline) once the slot's verifiers agree on a mismatch
    if (slot.worker == me and slot.dispute_deadline and not slot.disputed and not slot.referees
            and now_ms <= slot.dispute_deadline):
        out.append(duty(DISPUTE, slot.dispute_deadline))
    for entry in slot.referees:
        if entry.referee != me or entry.vote is not None or entry.unrevealed:
            continue
        deadline = entry.deadline or slot.referee_deadline
        if entry.commitment is None and not slot.referee_reveal_deadline and _open(deadline, now_ms):
            out.append(duty(REFEREE, deadline))
        elif entry.commitment is not None and slot.referee_reveal_deadline and now_ms <= slot.referee_reveal_deadline:
            out.append(duty(REFEREE_REVEAL, slot.referee_reveal_deadline))
    return out


def duties_for(task: TaskInfo, me: str, now_ms: int) -> list[Duty]:
    """The verification messages `me` still owes `task` at block time `now_ms`, in slot order."""
    return [duty for slot in task.slots if slot.pending for duty in _slot_duties(task.task_id, slot, me, now_ms)]


def referee_panel(task: TaskInfo, slot: int, me: str) -> int:
    """The panel ``me`` sits on as a referee of ``slot`` (its vote commitment binds it, docs/adr/0210)."""
    return next((r.panel for r in task.slots[slot].referees if r.referee == me), 0)

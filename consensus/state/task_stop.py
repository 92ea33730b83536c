"""The owner's stop of a running task cut into epochs (docs/adr/0211, issue 23 item 2).

``stop_task {task_id}`` from the task's owner, while the task is open for commitments and its open
epoch is not its last: the run ends at the next epoch boundary. The ledger marks the open epoch as the
last one (``epochs.stop_at``); when that epoch closes (the crew committed it, or a quorum by its
deadline: consensus/state/tasks.py ``_close_epoch``), the task stops there like a crew that stopped
(ADR 0203: every worker is held to its latest commitment within the closed epochs, audited and paid
for the epochs it covers, the rest of the escrow back to the owner) and settles ``stopped``. The
weights of the last closed epoch stay fetchable (``task fetch``, ``task fetch --epoch N``: the state
its workers committed, verified against the ledger's ``state_digest``). A stop asked in the last epoch
is refused: that epoch's end is the task's end (its result); a task not assigned yet is cancelled
instead (``cancel_task``). Pure functions of the task; the handler checks everything before it changes
anything.
"""
from __future__ import annotations

from typing import Any

from consensus.state import epochs
from consensus.state.records import Task, TaskStatus
from consensus.txcodes import TxCode, TxError

STOP_KEY = "stop_at"


def check_stop(task: Task, sender: str) -> None:
    """Refuse a stop that is not the owner's, of a task not running, not cut into epochs, already
    stopping, or in its last epoch."""
    if sender != task.owner:
        raise TxError(TxCode.UNAUTHORIZED, "only the task owner can stop it")
    if task.status == TaskStatus.CREATED:
        raise TxError(TxCode.BAD_STATE, "the task is not assigned yet: cancel it (cancel_task) to get the escrow back")
    if task.status not in TaskStatus.OPEN_FOR_COMMITS:
        raise TxError(TxCode.BAD_STATE, f"cannot stop a task that is {task.status}")
    if epochs.count(task) <= 1:
        raise TxError(TxCode.BAD_STATE, "this task is not cut into epochs: it has no boundary to stop at before "
                                        "its end")
    if STOP_KEY in task.epochs:
        raise TxError(TxCode.ALREADY_KNOWN, f"the task already stops at the end of epoch {task.epochs[STOP_KEY] + 1}")
    if not epochs.before_last(task):
        raise TxError(TxCode.BAD_STATE, f"the task is in its last epoch ({epochs.count(task)} of "
                                        f"{epochs.count(task)}): it ends with its result at that epoch's end")


def request(task: Task) -> dict[str, Any]:
    """Mark the open epoch as the task's last; the event says where it will stop."""
    epoch = epochs.current(task)
    task.epochs[STOP_KEY] = epoch
    return {"type": "task_stop_requested", "epoch": epoch, "epochs": epochs.count(task)}


def due(task: Task) -> bool:
    """Whether the epoch the owner stops at has closed (the task stops now)."""
    return STOP_KEY in task.epochs and "stopped" not in task.epochs and epochs.closed(task) > task.epochs[STOP_KEY]


def stop(task: Task) -> dict[str, Any]:
    """Stop the task at its last closed epoch (ADR 0203's stop), with the owner's reason."""
    event = epochs.stop(task)
    last = epochs.closed(task)
    task.reason = (f"stopped by its owner at the end of epoch {last} of {epochs.count(task)}: the {last} closed "
                   f"epoch{'s' if last != 1 else ''} are audited and paid, the rest refunded to the owner")
    return {**event, "reason": task.reason, "by_owner": True}

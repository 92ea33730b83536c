"""Epochs of a long task and their progress commitments (docs/adr/0203).

A task whose spec declares ``epochs`` = E > 1 (its ``segments`` a multiple of E and its ``expected_s``
declared: the layout is fixed at submit, ``check_layout``) is cut into E epochs of segments / E
segments each. At the end of each epoch but the last, every member of the crew sends ``commit_epoch``:
the Merkle root of its segment records so far, their count (checked against the layout) and the
digest of its state at the epoch end; the last epoch ends with the task's ``commit_result``.

Each epoch has its own deadline (``deadlines.task_span_ms`` of one epoch's work, from the close of the
previous one), so a crew that stops committing is caught within one epoch. An epoch closes when every
member still in the crew committed it, or at its deadline once a quorum of the task's workers did (the
quorum grace of ADR 0081 applies per epoch); a member that did not commit a closed epoch has left the
crew ("departed"). A deadline that passes below quorum stops the task at its last closed epoch
(``stop``). Each epoch is audited as it closes and paid out once audited (docs/adr/0230: ``trained`` says
who is held to an epoch's work, consensus/state/epoch_pay.py pays it); when the commit phase closes, a
worker that left is held to its latest commitment within the closed epochs (``include_departed``). A
worker that left the crew (``left_crew``) whose verifiers all find it unreachable (``left_unreachable``)
ends that slot unaudited: unpaid, not slashed (an honest worker that crashed is not a cheater; ADR 0188
never pays unaudited); one still in the crew is challenged (ADR 0207), and a silent one waits until it
commits again (withholding) or leaves (``presence_unknown``). A worker found guilty leaves the crew.
Pure functions of the task and the block; the handlers live in consensus/state/tasks.py.
"""
from __future__ import annotations

import hashlib
from typing import Any

from consensus.state import crew, deadlines
from consensus.state.context import BlockContext
from consensus.state.records import SlotOutcome, Task, TaskStatus
from consensus.txcodes import TxCode, TxError

UNAVAILABLE_DOMAIN = b"dekube/unavailable"


def check_layout(payload: dict[str, Any]) -> None:
    """Refuse a submit whose epoch layout the ledger could not hold commitments to: ``epochs`` must
    divide ``segments`` (an epoch ends at a segment boundary), a task of several epochs must declare
    its ``expected_s`` (each epoch's deadline is derived from it), and a crew may grow past its
    ``workers`` (up to ``max_workers``) only at epoch boundaries (docs/adr/0234)."""
    epochs = payload.get("epochs", 1)
    if epochs > 1 and payload["segments"] % epochs:
        raise TxError(TxCode.BAD_PAYLOAD, f"{epochs} epochs do not divide the task's {payload['segments']} segments")
    most = payload.get("max_workers", payload["workers"])
    if most < payload["workers"]:
        raise TxError(TxCode.BAD_PAYLOAD, f"max_workers {most} is below the {payload['workers']} workers asked for")
    if most > payload["workers"] and epochs <= 1:
        raise TxError(TxCode.BAD_PAYLOAD, "extra workers join at epoch boundaries: a task that may grow past its "
                                          "workers must be cut into epochs")
    if epochs > 1 and "expected_s" not in payload:
        raise TxError(TxCode.BAD_PAYLOAD, "a task of several epochs must declare expected_s (each epoch's deadline "
                                          "is derived from it)")


def count(task: Task) -> int:
    return deadlines.epoch_count(task)


def segments_per_epoch(task: Task) -> int:
    return task.segments // count(task)


def start(task: Task) -> None:
    """At assignment: epoch 0 opens (its deadline is the task's commit_deadline)."""
    if count(task) > 1:
        task.epochs = {"current": 0, "commits": {}}


def current(task: Task) -> int:
    """The open epoch (0 for a task without epochs)."""
    return int(task.epochs.get("current", 0))


def entries(task: Task, worker: str) -> list:
    """``worker``'s epoch commitments, [segments_root, state_digest, segments, height] each, in order
    (from its first epoch: a joiner's start later, consensus/state/crew.py)."""
    return list(task.epochs.get("commits", {}).get(worker, []))


def covered(task: Task, worker: str) -> int:
    """How many epochs from the task's start ``worker``'s progress commitments reach (a joiner's count
    from its first epoch)."""
    return crew.first_epoch(task, worker) + len(entries(task, worker))


def first_segment(task: Task, worker: str) -> int:
    """The first segment ``worker`` trained (0, or a joiner's first epoch's first segment)."""
    first = crew.first_epoch(task, worker)
    return first * segments_per_epoch(task) if first else 0


def in_crew(task: Task, worker: str) -> bool:
    """Whether ``worker`` still belongs to the crew: it did not reject the task, committed every closed
    epoch (a joiner: every closed epoch from its first), no audit found it guilty (ADR 0230: its seat
    goes to a joiner at the next epoch close) and its seat was not given to a new crew from an epoch it
    had not finished (docs/adr/0232)."""
    reached = covered(task, worker)
    return (worker not in task.rejections and reached >= current(task) and not crew.superseded(task, worker, reached)
            and not any(slot["worker"] == worker and slot["outcome"] == SlotOutcome.GUILTY for slot in task.slots))


def departed(task: Task) -> set[str]:
    """The workers that left the crew: they missed a closed epoch."""
    return {worker for worker in task.workers if worker not in task.rejections and not in_crew(task, worker)}


def committed(task: Task, epoch: int) -> list[str]:
    """The workers that committed ``epoch``."""
    return sorted(worker for worker in task.workers
                  if crew.first_epoch(task, worker) <= epoch < covered(task, worker))


def before_last(task: Task) -> bool:
    """Whether the open epoch is one that ends with ``commit_epoch`` (not the task's last)."""
    return current(task) < count(task) - 1


def check_commit(task: Task, worker: str, payload: dict[str, Any]) -> None:
    """Refuse a progress commitment that is not ``worker``'s next epoch, or whose segment count is not
    the epoch layout's (fixed by the spec: issue 24, item 2)."""
    if count(task) <= 1:
        raise TxError(TxCode.BAD_STATE, "this task is not cut into epochs; commit its result")
    epoch, mine = payload["epoch"], covered(task, worker)
    if epoch >= count(task) - 1:
        raise TxError(TxCode.BAD_PAYLOAD, f"epoch {epoch} is not a progress epoch: the task has {count(task)} "
                                          "epochs and the last one ends with commit_result")
    if not in_crew(task, worker):
        raise TxError(TxCode.BAD_STATE, f"this worker left the crew: it did not commit epoch {mine}, which closed")
    if epoch < crew.first_epoch(task, worker):
        raise TxError(TxCode.BAD_STATE, f"this worker joined the crew at epoch {crew.first_epoch(task, worker)}; "
                                        f"it has nothing to commit for epoch {epoch}")
    if epoch < mine:
        raise TxError(TxCode.ALREADY_KNOWN, f"this worker already committed epoch {epoch}")
    if epoch > mine:
        raise TxError(TxCode.BAD_STATE, f"this worker must commit epoch {mine} first")
    expected = (epoch + 1) * segments_per_epoch(task)
    if payload["segments"] != expected:
        raise TxError(TxCode.BAD_PAYLOAD, f"epoch {epoch} ends after segment {expected} of the task's layout "
                                          f"({count(task)} epochs of {segments_per_epoch(task)}); the commitment "
                                          f"has {payload['segments']}")


def check_result(task: Task, worker: str) -> None:
    """Refuse a task result from a worker that left the crew or skipped a progress epoch."""
    if count(task) <= 1:
        return
    if not in_crew(task, worker):
        raise TxError(TxCode.BAD_STATE, "this worker left the crew: it missed a closed epoch")
    if covered(task, worker) != count(task) - 1:
        raise TxError(TxCode.BAD_STATE, f"this worker must commit epoch {covered(task, worker)} first")


def record(task: Task, worker: str, payload: dict[str, Any], height: int) -> None:
    task.epochs.setdefault("commits", {}).setdefault(worker, []).append(
        [payload["segments_root"], payload["state_digest"], payload["segments"], height])


def all_committed(task: Task) -> bool:
    """Whether every member of the crew committed the open epoch (it can close at once; a joiner whose
    first epoch is later has nothing to commit in it)."""
    members = [worker for worker in task.workers if in_crew(task, worker)]
    return bool(members) and all(covered(task, worker) > current(task) for worker in members)


def close(ctx: BlockContext, task: Task, span_ms: int) -> dict[str, Any]:
    """Close the open epoch (a quorum committed it): the next one opens with a deadline ``span_ms``
    from this block; the event says who committed and who left the crew."""
    epoch = current(task)
    members = [worker for worker in task.workers if in_crew(task, worker) and crew.first_epoch(task, worker) <= epoch]
    done = committed(task, epoch)
    task.epochs["current"] = epoch + 1
    task.commit_deadline = ctx.time_ms + span_ms
    return {"type": "epoch_closed", "epoch": epoch, "committed": done,
            "departed": sorted(set(members) - set(done)), "deadline": task.commit_deadline}


def never_started(task: Task, worker: str) -> bool:
    """Whether ``worker`` joined the crew at an epoch the task never reached (it stopped before)."""
    return "stopped" in task.epochs and crew.first_epoch(task, worker) > int(task.epochs["stopped"])


def join_epoch(task: Task) -> int:
    """The epoch a worker named now enters at: one past the furthest any member committed (members
    commit an epoch while they train the next, so the crew of that one may already be read; ADR 0226)."""
    reached = max((covered(task, worker) for worker in task.workers if in_crew(task, worker)), default=current(task))
    return max(current(task), reached) + 1


def closed(task: Task) -> int:
    """How many epochs have closed."""
    return current(task)


def stop(task: Task) -> dict[str, Any]:
    """The crew stopped committing in the open epoch: the task ends at its last closed epoch. Each worker
    that committed something is held to its latest commitment within the closed epochs (audited and paid
    for those); the event and ``reason`` say where it stopped."""
    epoch, last = current(task), closed(task)
    task.epochs["stopped"] = epoch
    task.commits = {}
    for worker in task.workers:
        mine = entries(task, worker)
        within = min(covered(task, worker), last) - crew.first_epoch(task, worker)
        if within > 0:
            task.commits[worker] = list(mine[within - 1])
    task.reason = (f"the crew stopped committing in epoch {epoch + 1} of {count(task)}: the {last} closed "
                   f"epoch{'s' if last != 1 else ''} are audited and paid, the rest refunded to the owner")
    return {"type": "task_stopped", "epoch": epoch, "closed": last, "reason": task.reason}


def include_departed(task: Task) -> None:
    """When the commit phase closes, the workers that left the crew after committing some epochs are
    held to their latest epoch commitment (the task's record of what each did; their epochs were audited
    and paid as they closed, docs/adr/0230)."""
    for worker in sorted(departed(task)):
        mine = entries(task, worker)
        if mine and worker not in task.commits:
            task.commits[worker] = list(mine[-1])


def epoch_range(task: Task, epoch: int) -> tuple[int, int]:
    """The segments ``epoch`` covers: [first, end) (the whole task for a task without epochs)."""
    per = segments_per_epoch(task)
    return epoch * per, (epoch + 1) * per


def trained(task: Task, epoch: int) -> dict[str, list]:
    """Who is held to the work of ``epoch``, each with the commitment that covers it ([segments_root,
    state or result, segments, height]): for a closed progress epoch the workers that committed it; for
    the last (or only) epoch the workers whose result covers the whole task (docs/adr/0230)."""
    if epoch < count(task) - 1:   # only a closed epoch's work counts (a worker may commit ahead of a stop)
        return {worker: entries(task, worker)[epoch - crew.first_epoch(task, worker)]
                for worker in committed(task, epoch)} if epoch < closed(task) else {}
    return {worker: commit for worker, commit in sorted(task.commits.items()) if commit[2] == task.segments}


def unavailable_evidence(salt: bytes) -> bytes:
    """What every honest judge answers (with match false) when it cannot get a worker's record or state:
    sha256(salt || "dekube/unavailable")."""
    return hashlib.sha256(salt + UNAVAILABLE_DOMAIN).digest()


def left_crew(task: Task, worker: str) -> bool:
    """Whether ``worker`` left a task cut into epochs before its end: the crew stopped, it missed a closed
    epoch (or was found guilty), or the commit phase closed without its result."""
    if count(task) <= 1:
        return False
    if "stopped" in task.epochs:
        return True
    if task.status in TaskStatus.OPEN_FOR_COMMITS:
        return not in_crew(task, worker)
    commit = task.commits.get(worker)
    return commit is None or commit[2] < task.segments


def presence_unknown(task: Task, slot: dict[str, Any]) -> bool:
    """Whether the ledger cannot tell yet if ``slot``'s worker, challenged to show an epoch's record and
    silent, is withholding or gone: the task still takes commitments, the worker is in the crew and has
    committed nothing after the audited epoch. A later commitment shows it alive (withholding: guilty);
    missing an epoch shows it gone (unaudited, ADR 0230)."""
    if count(task) <= 1 or task.status not in TaskStatus.OPEN_FOR_COMMITS or not in_crew(task, slot["worker"]):
        return False
    return covered(task, slot["worker"]) <= int(slot.get("epoch", 0)) + 1 and slot["worker"] not in task.commits


def left_unreachable(task: Task, slot: dict[str, Any], match: bool, evidence: bytes) -> bool:
    """Whether the verifiers' agreed answer for ``slot`` is "unreachable" and its worker left the crew
    (``left_crew``): the slot ends unaudited (an honest worker that crashed is not a cheater)."""
    return not match and evidence == unavailable_evidence(slot["salt"]) and left_crew(task, slot["worker"])

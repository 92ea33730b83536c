"""Bounded ledger state (docs/adr/0215): ended tasks and old double-sign evidence leave the state.

A task whose status becomes final (``TaskStatus.FINAL``) is queued, at the end of the block that ended
it, in the ``retire`` table under the key ``due || kind || task_id`` (``due``: the block time in ms from
which it may go, 8 bytes big-endian, so the table sorts by it; ``kind``: ``KIND_TASK`` or ``KIND_TOMBSTONE``), the
value being its end time. At the end of every block the queue is popped from its front while its due
time is reached, at most ``PRUNE_PER_BLOCK`` entries a block (the rest wait for the next blocks):

- a ``KIND_TASK`` entry deletes the task record (its spec, commits, audit slots, verifier answers, referee
  votes, epochs, payouts: everything keyed by the task) and leaves a tombstone, ``pruned_tasks[task_id]
  = end time``, queued as a ``KIND_TOMBSTONE`` entry due one more retention later, so a reader is told the task
  was pruned rather than that it never existed. A task something still reads is not deleted: its entry
  goes back to the queue one retention later. A final task's escrow is empty and no transaction acts on
  it (finalize, audits, disputes, referee votes, relay receipts and stops need it active); what does read
  it is the rejection bars (consensus/state/rejections.py ``recent_bars``: a task with rejections assigned
  within ``REJECT_COOLDOWN_BLOCKS``). An audit slot, dispute or referee panel still open means the task
  is not final, so it is never queued; the stake its parties unbond is held by active tasks only
  (consensus/state/obligations.py).
- a ``KIND_TOMBSTONE`` entry forgets the pruned task's id.

Double-sign evidence (``state.evidence``: offence key -> height it was applied at) is dropped once no
block could accept evidence of that offence again (``height + evidence_max_age <= current height``:
later evidence of it is refused as too old, consensus/state/evidence.py), oldest first, at most
``PRUNE_PER_BLOCK`` a block.

The queues live in the state (the ``retire`` table, the evidence heights), so they are in every app hash
and snapshot; the in-memory heaps here are derived from them on first use, so a node loaded from storage
or a snapshot pops exactly what a node that executed every block pops. Every deletion goes through
``LedgerState.touch``, so the change set (app hash, storage) deletes the keys.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from consensus.genesis import Params
from consensus.state.context import BlockContext
from consensus.state.records import Task, TaskStatus
from consensus.state.rejections import REJECT_COOLDOWN_BLOCKS
from consensus.state.store import EVIDENCE, PRUNED, RETIRE, TASK, LedgerState

PRUNE_PER_BLOCK = 64          # queue entries (tasks, tombstones) and evidence entries popped a block, each
KIND_TASK, KIND_TOMBSTONE = b"\x00", b"\x01"   # a queue entry prunes a task, or forgets a pruned task's id
_DUE_BYTES = 8


@dataclass
class Queues:
    """The retention queues as heaps (derived from the state): retire keys, and (height, evidence key)."""

    retire: list[bytes] = field(default_factory=list)
    evidence: list[tuple[int, bytes]] = field(default_factory=list)
    queued: set[bytes] = field(default_factory=set)   # task ids with a TASK entry in the queue


def retire_key(due_ms: int, kind: bytes, task_id: bytes) -> bytes:
    """A queue key: sorts by due time, then kind, then task id."""
    return due_ms.to_bytes(_DUE_BYTES, "big") + kind + task_id


def _queues(state: LedgerState) -> Queues:
    if state.retention is None:   # sorted lists are heaps
        state.retention = Queues(
            retire=sorted(state.retire), evidence=sorted((h, k) for k, h in state.evidence.items()),
            queued={key[_DUE_BYTES + 1:] for key in state.retire if key[_DUE_BYTES:_DUE_BYTES + 1] == KIND_TASK})
    queues: Queues = state.retention
    return queues


def _enqueue(state: LedgerState, queues: Queues, due_ms: int, kind: bytes, task_id: bytes, ended_ms: int) -> None:
    key = retire_key(due_ms, kind, task_id)
    state.retire[key] = ended_ms
    state.touch(RETIRE, key)
    heapq.heappush(queues.retire, key)
    if kind == KIND_TASK:
        queues.queued.add(task_id)


def still_needed(task: Task, height: int) -> bool:
    """Whether the ledger still reads this final task: a rejection within the bars' cooldown window."""
    return bool(task.rejections) and task.assigned_height > height - REJECT_COOLDOWN_BLOCKS


def end_block(state: LedgerState, params: Params, ctx: BlockContext) -> None:
    """Queue the tasks that ended in this block; prune what is due (bounded); drop evidence too old to matter."""
    fresh = state.retention is None   # built from the state as it is now: this block's evidence included
    queues = _queues(state)
    retention_ms = params.ended_task_retention_s * 1000
    if retention_ms:
        for task_id in state.touched(TASK):
            task = state.tasks.get(task_id)
            if task is not None and task.status in TaskStatus.FINAL and task_id not in queues.queued:
                _enqueue(state, queues, ctx.time_ms + retention_ms, KIND_TASK, task_id, ctx.time_ms)
    for key in [] if fresh else state.touched(EVIDENCE):
        if key in state.evidence:
            heapq.heappush(queues.evidence, (state.evidence[key], key))
    _pop_due(state, queues, ctx, retention_ms)
    _drop_old_evidence(state, params, queues, ctx.height)


def _pop_due(state: LedgerState, queues: Queues, ctx: BlockContext, retention_ms: int) -> None:
    for _ in range(PRUNE_PER_BLOCK):
        if not queues.retire or int.from_bytes(queues.retire[0][:_DUE_BYTES], "big") > ctx.time_ms:
            return
        key = heapq.heappop(queues.retire)
        ended_ms = state.retire.pop(key, None)
        if ended_ms is None:
            continue
        state.touch(RETIRE, key)
        kind, task_id = key[_DUE_BYTES:_DUE_BYTES + 1], key[_DUE_BYTES + 1:]
        if kind == KIND_TOMBSTONE:
            state.pruned_tasks.pop(task_id, None)
            state.touch(PRUNED, task_id)
            continue
        queues.queued.discard(task_id)
        task = state.tasks.get(task_id)
        if task is None or task.status not in TaskStatus.FINAL:
            continue
        if still_needed(task, ctx.height):
            _enqueue(state, queues, ctx.time_ms + retention_ms, KIND_TASK, task_id, ended_ms)
            continue
        del state.tasks[task_id]
        state.touch(TASK, task_id)
        state.pruned_tasks[task_id] = ended_ms
        state.touch(PRUNED, task_id)
        _enqueue(state, queues, ctx.time_ms + retention_ms, KIND_TOMBSTONE, task_id, ended_ms)
        state.events.append({"type": "task_pruned", "task_id": task_id, "ended_ms": ended_ms})


def _drop_old_evidence(state: LedgerState, params: Params, queues: Queues, height: int) -> None:
    for _ in range(PRUNE_PER_BLOCK):
        if not queues.evidence or queues.evidence[0][0] + params.evidence_max_age > height:
            return
        applied, key = heapq.heappop(queues.evidence)
        if state.evidence.get(key) == applied:
            del state.evidence[key]
            state.touch(EVIDENCE, key)


# ---- what readers are told about a task that is not in the state -----------------------------------

def _span(seconds: int) -> str:
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} s"


def pruned_task_message(task_id: bytes, retention_s: int) -> str:
    """What every reader (RPC, CLI, explorer) says of a task pruned from the state."""
    return (f"task {task_id.hex()} ended more than {_span(retention_s)} ago and its record was pruned from the "
            f"chain state (ended_task_retention_s = {retention_s}, docs/adr/0215); its payouts are in the "
            "blocks and events of its time, and its weights can no longer be fetched through the ledger "
            "(task fetch needs the record: fetch within the retention)")


def unknown_task_message(task_id: str) -> str:
    """What a reader says of a task id the state does not know (never submitted, not in a block yet, or pruned
    long ago: its tombstone is kept one retention after the record, then forgotten)."""
    return (f"no task {task_id} in the chain state: it is not in a block yet, it was never submitted on this "
            "chain, or it ended long ago and was pruned (an ended task's record is kept ended_task_retention_s, "
            "its id as long again, docs/adr/0215)")


def missing_task(state: LedgerState, task_id: bytes) -> str:
    """Why a transaction names a task the state does not hold: pruned after it ended, or unknown."""
    if task_id in state.pruned_tasks:
        return f"task {task_id.hex()} ended and its record was pruned from the chain state (docs/adr/0215)"
    return f"unknown task {task_id.hex()}"


def pruned_info(state: LedgerState, params: Params, task_id: bytes) -> dict | None:
    """A pruned task's tombstone as RPC shows it (None when the id is not a pruned task's)."""
    ended_ms = state.pruned_tasks.get(task_id)
    if ended_ms is None:
        return None
    return {"task_id": task_id.hex(), "pruned": True, "ended_ms": ended_ms,
            "retention_s": params.ended_task_retention_s,
            "message": pruned_task_message(task_id, params.ended_task_retention_s)}

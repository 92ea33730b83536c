"""A crew that died: its task restarts the open epoch on a new crew (docs/adr/0232, issue 23 item 3).

A task cut into epochs stops at its last closed epoch when the open epoch's deadline passes below quorum
(ADR 0203). When that deadline passes with no commitment of the open epoch at all (every member died, or
went silent) after at least one epoch closed, the ledger restarts the epoch instead, at most
``crew_restarts`` times per task: each seat whose occupant was to train the open epoch gets a new worker
(named as ADR 0226 names a replacement), entering at the open epoch itself and starting from the state
the crew committed for the epoch before; the epoch gets a fresh deadline (one epoch's span). The old
occupants are out of the crew from then on (consensus/state/crew.py ``superseded``): a late commitment of
theirs is refused, and each is held to, audited on and paid for the epochs it committed, as a worker that
left is. A seat whose occupant is a joiner still waiting for its first epoch (named to enter after the
open one) keeps it: it starts from the new crew's commitment of the open epoch.

No restart when the owner asked to stop (ADR 0211), when nobody holds a committed state to start from (no
epoch closed: the task expires refunded, as before), once the restarts are spent, or when fewer free
candidates than a quorum of seats can be named (the new crew could never close the epoch): the task then
stops at its last closed epoch as before. Pure functions of the task; tasks.py names the workers.
"""
from __future__ import annotations

from typing import Any

from consensus.genesis import Params
from consensus.state import crew, epochs, task_stop
from consensus.state.context import BlockContext
from consensus.state.records import Task

RESTARTS_KEY = "restarts"


def restarts(task: Task) -> int:
    """How many times the task's crew was restarted."""
    return int(task.epochs.get(RESTARTS_KEY, 0))


def allowed(params: Params, task: Task) -> bool:
    """Whether the open epoch, whose deadline passed below quorum, may restart on a new crew: an epoch
    closed (its committed state is where the new crew starts), nobody committed the open epoch (a live
    minority's work is not thrown away: the task stops), the owner did not ask to stop, and restarts
    are left."""
    return (epochs.count(task) > 1 and epochs.closed(task) > 0
            and not epochs.committed(task, epochs.current(task)) and not task.commits
            and task_stop.STOP_KEY not in task.epochs and restarts(task) < params.crew_restarts)


def vacant_seats(task: Task) -> list[int]:
    """The seats whose occupant was to train the open epoch: none of them committed it. A seat held by a
    joiner whose first epoch is later keeps it."""
    epoch = epochs.current(task)
    return [seat for seat in range(crew.open_seats(task))
            if crew.first_epoch(task, crew.occupant(task, seat)) <= epoch]


def begin(ctx: BlockContext, task: Task, span_ms: int, joiners: list[str]) -> dict[str, Any]:
    """Count the restart and give the open epoch a fresh deadline ``span_ms`` from this block (the
    ``joiners`` are already named to their seats); the event says where the new crew starts."""
    task.epochs[RESTARTS_KEY] = restarts(task) + 1
    task.commit_deadline = ctx.time_ms + span_ms
    epoch = epochs.current(task)
    return {"type": "crew_restarted", "epoch": epoch, "from_epoch": epoch - 1, "workers": list(joiners),
            "restart": restarts(task), "deadline": task.commit_deadline}

"""A long task's crew as seats, and the workers that join it at an epoch boundary (docs/adr/0226).

A task asks for ``spec["workers"]`` = W workers; assignment fills W seats with the chosen workers,
seat i being the i-th of them in sorted order (their rank in training: data shard, leader). A task cut
into epochs keeps its seats filled: when an epoch closes and a seat's occupant has left the crew (it
missed the closed epoch, ADR 0203), the ledger names a replacement, who takes the seat (its rank: the
same data shard, so no example of the epochs it trains is skipped or doubled) from a later epoch on.

Members run ahead of the ledger by up to one epoch (they commit an epoch while training the next), so
a joiner enters at ``join_epoch``: one epoch past the furthest commitment any member made. A member
reads the crew of epoch e + 1 only after its own commitment of epoch e is on the ledger, so every
joiner of that epoch is named before any member reads it, and all members see one crew per epoch.

The joiner starts from a state a member committed for the epoch before its first (it fetches the file
and checks its sha256 against that ``state_digest``), commits its epochs like any member, is audited on
the segments it trained and paid for the epochs it covers. ``task.workers`` keeps everyone who held a
seat (the original W first, in seat order, then the joiners in the order named); ``task.epochs["joined"]``
maps each joiner to ``[seat, first epoch]``.

An owner may let the crew grow (``spec["max_workers"]`` = M > W, docs/adr/0234): at each epoch close the
ledger also opens new seats W, W + 1, ... up to M for free candidates, named like replacements. The price
pays M seats (each seat's share is 1/M of the workers' part); a seat that never opens, or the epochs before
it opens, stay in the escrow for the owner. The training world of epoch e (``world_at``) is the number of
seats open by then, and the data is re-cut into that many shards from the epoch the world reached its size
(``world_since``): every shard of a world is disjoint, so no example is doubled within a pass. A worker
whose seat went to a later worker entering at an
epoch it had not finished is out of the crew (``superseded``): the crew restarted that epoch without it
(docs/adr/0232, consensus/state/crew_restart.py). Pure functions of the task; the handlers live in
consensus/state/tasks.py.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from consensus.state.records import Task

JOINED_KEY = "joined"


def seats(task: Task) -> int:
    """How many seats the task asked for (W, what its quorums count)."""
    return int(task.spec["workers"])


def max_seats(task: Task) -> int:
    """How many seats the task may grow to (M >= W: its price pays that many, docs/adr/0234)."""
    return int(task.spec.get("max_workers", task.spec["workers"]))


def open_seats(task: Task) -> int:
    """How many seats are open now: the W first, and the extra seats named so far."""
    return world_at(seats(task), task.epochs.get(JOINED_KEY, {}), None)


def _openings(asked: int, joiners: Mapping[str, Sequence[int]]) -> dict[int, int]:
    """Each extra seat (>= ``asked``) and the epoch its first occupant entered at."""
    opened: dict[int, int] = {}
    for seat, first in joiners.values():
        if int(seat) >= asked:
            opened[int(seat)] = min(int(first), opened.get(int(seat), int(first)))
    return opened


def world_at(asked: int, joiners: Mapping[str, Sequence[int]], epoch: int | None) -> int:
    """The training world of ``epoch`` (every seat named so far when None): the ``asked`` seats and each
    extra seat whose first occupant enters at an epoch not after it."""
    return asked + sum(1 for first in _openings(asked, joiners).values() if epoch is None or first <= epoch)


def world_since(asked: int, joiners: Mapping[str, Sequence[int]], epoch: int) -> int:
    """The first epoch whose world is that of ``epoch`` (the world only grows): where its data shards start."""
    return max((first for first in _openings(asked, joiners).values() if first <= epoch), default=0)


def seat_of(workers: Sequence[str], joiners: Mapping[str, Sequence[int]], worker: str) -> int:
    """``worker``'s seat (its rank in training): a joiner's from ``joiners``, an original worker's its
    place among the task's first workers (sorted at assignment)."""
    entry = joiners.get(worker)
    if entry is not None:
        return int(entry[0])
    return list(workers).index(worker)


def first_epoch_of(joiners: Mapping[str, Sequence[int]], worker: str) -> int:
    """The first epoch ``worker`` trains (0 for an original worker)."""
    entry = joiners.get(worker)
    return int(entry[1]) if entry is not None else 0


def first_epoch(task: Task, worker: str) -> int:
    return first_epoch_of(task.epochs.get(JOINED_KEY, {}), worker)


def is_joiner(task: Task, worker: str) -> bool:
    return worker in task.epochs.get(JOINED_KEY, {})


def occupant(task: Task, seat: int) -> str:
    """The latest worker named to ``seat`` (an open one): its last joiner (joiners are appended to
    ``task.workers`` as they are named), else its original worker."""
    named = [worker for worker, (joined_seat, _) in task.epochs.get(JOINED_KEY, {}).items() if joined_seat == seat]
    return max(named, key=task.workers.index) if named else task.workers[seat]


def superseded_in(workers: Sequence[str], joiners: Mapping[str, Sequence[int]], worker: str, reached: int,
                  epoch: int | None = None) -> bool:
    """Whether a worker named after ``worker`` took its seat from an epoch ``worker`` had not finished
    (``reached``: one past the last epoch it committed), and not after ``epoch`` when given: the crew
    restarted that epoch without it (docs/adr/0232). A replacement of a worker that left the crew enters
    past the epoch it missed, so this only holds after a restart."""
    order = list(workers)
    seat, limit = seat_of(order, joiners, worker), reached if epoch is None else min(reached, epoch)
    return any(joiners[later][0] == seat and joiners[later][1] <= limit
               for later in order[order.index(worker) + 1:] if later in joiners)


def superseded(task: Task, worker: str, reached: int) -> bool:
    return superseded_in(task.workers, task.epochs.get(JOINED_KEY, {}), worker, reached)


def join(task: Task, worker: str, seat: int, epoch: int) -> dict[str, Any]:
    """Name ``worker`` to ``seat`` from ``epoch`` on; the event says who it replaces (None: a new seat)."""
    replaced = occupant(task, seat) if seat < open_seats(task) else None
    task.workers.append(worker)
    task.epochs.setdefault(JOINED_KEY, {})[worker] = [seat, epoch]
    return {"type": "worker_joined", "worker": worker, "seat": seat, "epoch": epoch, "replaces": replaced}

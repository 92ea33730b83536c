"""A running crew that changes at an epoch boundary, on the workers' side (docs/adr/0226; the ledger's
side is consensus/state/crew.py).

A member (`CrewGate`, awaited by the segment recorder before each segment): at the first segment of an
epoch after its own first, it waits until its commitment of the epoch before is on the ledger, then reads
which workers the ledger named to enter at this epoch (by then every such joiner is named: the ledger names
joiners one epoch past the furthest commitment), makes them members of the all-reduce group from this
segment's first round on and waits for them to start their group (bounded: `join_wait_s` of the state's
size; a joiner that is late is left out of rounds like any member that does not answer, misses the epoch
and leaves the crew). No round of the member is in flight then, and every member changes at the same round.

Every member's group must hold the same members (the round's member masks are over them): the group of
epoch e is every worker named to a seat from an epoch not after e, less those that had left the crew when
epoch e - 2 closed (`group_of`: they missed a closed epoch, which no later read can undo; a worker that
left after is left out of each round as before, ADR 0081, until the next boundary drops it). A member reads
it after its own commitment of epoch e - 1 and once epoch e - 2 closed, a joiner after some member's
commitment of e - 1 and that close: no worker entering at e or before can be named after either read, and
every reader sees the same closed epochs.

A joiner (`joining_state`): waits until a member committed the epoch before its first, fetches that state
from every worker that committed the same digest at once (asking them again for a while when none answers:
after a crew died, a former member that restarts serves it again, docs/adr/0232), checks its sha256 against
the digest and loads it with the bounded state-file reader; its trainer starts from it at the first step
of its first epoch, in the seat it took (the same rank, so the same data shard).

A crew allowed to grow (docs/adr/0234) opens extra seats at epoch boundaries: their workers enter like
replacements, and at that boundary every member cuts the data into as many shards as there are seats now
(`reshard`), the same cut the auditors replay.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from consensus.state.crew import superseded_in
from consensus.task_info import TaskInfo, TaskStatus
from ml.compute.epoch_commits import crew_exit
from ml.compute.epoch_states import StateUnavailable, fetch_checked, holders_of
from ml.train.state_file import BadStateFile, load_state

log = logging.getLogger(__name__)

JOIN_WAIT_S = 120.0   # how long members wait at an epoch boundary for the workers entering there, plus
JOIN_MIN_FETCH_RATE = 1 << 20   # bytes/s: the time a joiner on a slow link needs to fetch the state
STATE_POLL_S = 2.0    # how often a joiner looks for the commitment of the epoch before its first
CLOSE_POLL_S = 1.0    # how often a member looks for the close of the epoch its group is read from
HOLDER_RETRY_S = 10.0   # how often a joiner asks the holders again when none serves the state (ADR 0232)
HOLDER_WAIT_S = 1800.0  # and for how long at most (its first epoch's deadline usually ends it sooner)
MAX_ERRORS = 4          # the last errors a JoinFailed names


class JoinFailed(RuntimeError):
    """A joiner could not get a checked state to start from."""


class CrewGate:
    """The member side of a crew change: ``await gate(segment)`` before each segment starts."""

    def __init__(self, me: str, first_epoch: int, per_epoch: int, committer: Any,
                 read_task: Callable[[], Awaitable[TaskInfo]], group: Any,
                 ready_among: Callable[[list[str], float], Awaitable[list[str]]], state_bytes: int = 0,
                 reshard: Callable[[int, int], None] | None = None, world: int = 0) -> None:
        self.me, self.first_epoch, self.per_epoch = me, first_epoch, per_epoch
        self.reshard, self.world = reshard, world   # the crew grew: (world, its first segment) (ADR 0234)
        self.wait_s = join_wait_s(state_bytes)
        self.committer, self.read_task, self.group, self.ready_among = committer, read_task, group, ready_among
        self.joined: dict[int, list[str]] = {}   # epoch -> the joiners that became members at its start
        self.left: dict[int, list[str]] = {}     # epoch -> the leavers dropped from the group at its start
        self.waited_s = 0.0                      # time spent at epoch boundaries (counted against utilization)

    async def __call__(self, segment: int) -> None:
        if self.per_epoch <= 0 or segment % self.per_epoch or segment // self.per_epoch <= self.first_epoch:
            return
        epoch = segment // self.per_epoch
        started = time.monotonic()
        try:
            await self.committer.wait_committed(epoch - 1)
            task = await self.read_task()
            while not group_readable(task, epoch):   # epoch e - 2 closes at the latest at its deadline
                await asyncio.sleep(CLOSE_POLL_S)
                task = await self.read_task()
            members = group_of(task, epoch)
            gone = sorted(set(self.group.peers) - set(members) - {self.me})
            if gone:   # they left the crew: no round waits for them any more (their attempts cost a timeout)
                self.group.set_peers(sorted(set(self.group.peers) - set(gone)))
                self.left[epoch] = gone
                log.info("epoch %d: %s left the group (they left the crew)", epoch, [w[:16] for w in gone])
            if self.reshard is not None and task.world_at(epoch) != self.world:   # extra seats open: data cut anew
                self.world = task.world_at(epoch)
                self.reshard(self.world, task.shards_from(epoch))
                log.info("epoch %d: the crew grew to %d seats; the data is cut into as many shards", epoch,
                         self.world)
            entering = [w for w in task.workers if task.first_epoch(w) == epoch and w != self.me]
            if not entering:
                return
            self.group.accept(entering)
            self.group.set_peers(sorted(set(self.group.peers) | set(entering)))
            ready = await self.ready_among(entering, self.wait_s)
            late = sorted(set(entering) - set(ready))
            if late:
                log.warning("epoch %d: joiners %s not ready after %g s; rounds go on without them", epoch,
                            [w[:16] for w in late], self.wait_s)
            self.joined[epoch] = ready
            log.info("epoch %d: %s joined the crew", epoch, [w[:16] for w in ready])
        finally:
            self.waited_s += time.monotonic() - started


async def joining_state(node: Any, task_id: str, first_epoch: int, read_task: Callable[[], Awaitable[TaskInfo]],
                        learn_addresses: Callable[[list[str]], Awaitable[None]],
                        wait_change: Callable[[float], Awaitable[None]],
                        retry_s: float = HOLDER_RETRY_S,
                        on_retry: Callable[[str], None] | None = None,
                        held: Callable[[str], str | None] = lambda digest: None) -> tuple[dict, str, TaskInfo]:
    """The state a joiner entering at ``first_epoch`` starts from, its digest, and the task as read once a
    member committed the epoch before (its group, `group_of`, is final then): a member's committed state of
    that epoch, fetched from its holders and checked. Waits for that commitment while the task is open; when
    no holder serves it (a crew that died, docs/adr/0232), asks every holder again each ``retry_s`` (a former
    member that restarts with its home serves it again) for at most HOLDER_WAIT_S, telling ``on_retry`` why
    each time. ``held``: the artifact id of a state this node keeps itself (a verifier's mirror of it,
    docs/adr/0236). JoinFailed when the task ended, this worker is no longer in its crew, or no holder served
    a checked file in that time."""
    epoch = first_epoch - 1
    errors: list[str] = []
    failing_since: float | None = None
    while True:
        task = await read_task()
        if task.status not in TaskStatus.OPEN_FOR_COMMITS:
            raise JoinFailed(f"the task is {task.status}: there is no crew to join{_tried(errors)}")
        out = crew_exit(task, node.peer_id)
        if out:
            raise JoinFailed(f"{out}{_tried(errors)}")
        candidates = holders_of(task, epoch)
        if not (candidates and group_readable(task, first_epoch)):
            await wait_change(STATE_POLL_S)
            continue
        for digest, holders in candidates:
            await learn_addresses(holders)
            try:
                path = await fetch_checked(node, holders, task_id, digest, held(digest))   # ours if mirrored
                return await asyncio.to_thread(_read_state, path), digest, task
            except (StateUnavailable, BadStateFile) as exc:
                errors = [*errors[-(MAX_ERRORS - 1):], str(exc)]
        failing_since = time.monotonic() if failing_since is None else failing_since
        if time.monotonic() - failing_since >= HOLDER_WAIT_S:
            raise JoinFailed(f"no checked state of epoch {epoch + 1} to start from in {HOLDER_WAIT_S:g} s"
                             f"{_tried(errors)}")
        log.info("task %s: no holder of epoch %d's state answers; asking again in %g s", task_id[:16], epoch + 1,
                 retry_s)
        if on_retry is not None:
            on_retry(errors[-1])
        await asyncio.sleep(retry_s)


def _tried(errors: list[str]) -> str:
    return (": " + "; ".join(errors)) if errors else ""


def join_wait_s(state_bytes: int) -> float:
    """How long members wait for a joiner: JOIN_WAIT_S plus its fetch of a state of ``state_bytes`` at
    JOIN_MIN_FETCH_RATE (a bigger model waits longer)."""
    return JOIN_WAIT_S + state_bytes / JOIN_MIN_FETCH_RATE


def group_readable(task: TaskInfo, epoch: int) -> bool:
    """Whether ``group_of(task, epoch)`` is final: epoch ``epoch`` - 2 closed (or the task no longer takes
    commitments)."""
    return task.epochs is None or task.epochs.current >= epoch - 1 or task.status not in TaskStatus.OPEN_FOR_COMMITS


def group_of(task: TaskInfo, epoch: int) -> list[str]:
    """The members of the all-reduce group of ``epoch``: every worker named to a seat from an epoch not after
    it, less those that had left the crew when epoch ``epoch`` - 2 closed (they did not commit it, a fact no
    later read can change; one that left later is still listed: each round leaves it out) and those whose
    seat a restarted crew took at an epoch not after ``epoch`` (docs/adr/0232: whoever reads that group
    reads it after the restart)."""
    progress = task.epochs
    if progress is None:
        return sorted(task.workers)

    def out(worker: str) -> bool:
        reached = progress.first_epoch(worker) + len(progress.of(worker))
        return (epoch >= 2 and reached < epoch - 1) or superseded_in(task.workers, progress.joined, worker, reached,
                                                                   epoch)
    return sorted(w for w in task.workers if progress.first_epoch(w) <= epoch and not out(w))


def _read_state(path: Path) -> dict:
    state = load_state(path.read_bytes())
    if not isinstance(state, dict):
        raise BadStateFile("the state file does not hold a training state")
    return state


def start_from(trainer: Any, state: dict, first_step: int, first_segment: int) -> None:
    """Load ``state`` into a joiner's ``trainer`` (blocking: call it in a thread) and check it is the state
    at the start of its first epoch; JoinFailed otherwise."""
    try:
        trainer.load_training_state(state)
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as exc:
        raise JoinFailed(f"the committed state does not fit the task's trainer: {exc}") from None
    if trainer.step != first_step or getattr(trainer, "outer_step", first_segment) != first_segment:
        raise JoinFailed(f"the committed state is at step {trainer.step}, not at the epoch's first step {first_step}")

"""Verifiers keep a copy of each closed epoch's committed state, so a task's last state outlives its crew
(docs/adr/0236).

Only the workers that committed an epoch's state held it (docs/adr/0211, 0232): a crew that died and never
came back took the task's last state with it, so no new crew could start from it (the restarts ran out) and
the owner could not fetch its weights. Now each verifier drawn for an epoch's audit slots (they are online,
staked, and named on the ledger) fetches that epoch's state as soon as the slots are drawn, checks its
sha256 against the committed digest, and serves it like a worker does: over the progress protocol, its
board's ``epoch_states`` (digest -> artifact id) for the task, from its artifact store. `holders_of`
(ml/compute/epoch_states.py) lists these mirrors after the committers, so a joiner and `task fetch --epoch`
find the state at a mirror when no committer answers.

What a verifier keeps is bounded (docs/adr/0240): only the states `owed` names now (the latest `MIRROR_EPOCHS`
closed epochs of each open task it audits, in the ledger's task list) are pinned against the store's
eviction, and together they take at most `MIRROR_SHARE` of its artifact quota: a state that would not fit
is not fetched at all (its manifest says its size first), so no number of tasks, however cheap, crowds out
the files a verifier's own audits and work need. A state no longer owed (its epoch left the window, or its
task ended) stays on disk while nothing else needs the room: the owner may still fetch it.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from consensus.task_info import TaskInfo, TaskStatus
from ml.compute.epoch_states import StateUnavailable, committed_states, fetch_checked_artifact, mirrors_of
from ml.compute.job_board import JobBoard, JobState
from node.artifacts import ArtifactTooLarge

log = logging.getLogger(__name__)

MIRROR_EPOCHS = 2       # the latest closed epochs of a task a verifier keeps
RETRY_S = 10.0          # a state no committer served yet is asked for again after this
MIRROR_SHARE = 0.25     # the most of its artifact quota a verifier's pinned mirrors take together


def owed(task: TaskInfo, me: str) -> list[tuple[int, str, list[str]]]:
    """(epoch, state digest, committers) of the latest closed epochs of ``task`` whose audit slots drew ``me``:
    the states this node keeps (the most committed digest of each)."""
    progress = task.epochs
    if progress is None or task.status not in TaskStatus.ACTIVE:
        return []
    out = []
    for epoch in range(max(0, progress.current - MIRROR_EPOCHS), progress.current):
        states = committed_states(task, epoch)
        if states and me in mirrors_of(task, epoch) and me not in states[0][1]:   # a committer holds its own
            digest, committers = states[0]
            out.append((epoch, digest, committers))
    return out


class StateMirror:
    """The verifier side: ``look(task)`` at every ledger look starts keeping what ``owed`` names."""

    def __init__(self, node: Any, board: JobBoard, learn_addresses: Callable[[list[str]], Awaitable[None]],
                 spawn: Callable[[Coroutine[Any, Any, None]], Any]) -> None:
        self.node, self.board, self.learn_addresses, self.spawn = node, board, learn_addresses, spawn
        self.started: set[tuple[str, str]] = set()   # (task id hex, digest) kept or being fetched
        self.kept: dict[tuple[str, str], str] = {}   # (task id hex, digest) -> the artifact it is kept under
        self.owed_now: dict[str, set[str]] = {}      # task id hex -> the digests `owed` names at the last look
        self.refused = 0                             # states not kept: the mirrors' share was full
        self._fetching = asyncio.Lock()              # one fetch at a time, so the share is never overrun
        self._pinned: set[str] = set()               # what the store was last told to pin

    def look_all(self, tasks: list[TaskInfo]) -> None:
        """``look`` at each of ``tasks`` (the listed tasks this node audits); a task not among them (it left
        the ledger's list) has nothing pinned any more."""
        for task in tasks:
            self._look(task)
        listed = {task.task_id for task in tasks}
        self.owed_now = {k: digests for k, digests in self.owed_now.items() if k in listed}
        self.kept = {k: a for k, a in self.kept.items() if k[0] in listed}
        self.started = {k for k in self.started if k[0] in listed}
        self._pin()

    def look(self, task: TaskInfo) -> None:
        """Keep what ``owed`` names and pin only that; once the task ended, the mirror's job ends too (its
        files stay while the store has room: the owner may still fetch an epoch)."""
        self._look(task)
        self._pin()

    def _look(self, task: TaskInfo) -> None:
        job = self.board.jobs.get(task.task_id)
        if task.status not in TaskStatus.ACTIVE and mirror_only(job):
            self.board.update(task.task_id, state=JobState.MIRRORED)
        now = owed(task, self.node.peer_id)
        self.owed_now[task.task_id] = {digest for _, digest, _ in now}
        for epoch, digest, committers in now:
            if (task.task_id, digest) not in self.started:
                self.started.add((task.task_id, digest))
                self.spawn(self._keep(task.task_id, epoch, digest, committers))

    def status(self) -> dict[str, int]:
        """For the node's status: the epoch states kept, pinned now, and refused for the share."""
        return {"kept": len(self.kept), "pinned": len(self._pinned), "refused": self.refused}

    def pinned(self) -> set[str]:
        """The artifacts of the mirrored states owed now."""
        return {artifact for (key, digest), artifact in self.kept.items() if digest in self.owed_now.get(key, ())}

    def _pin(self) -> None:
        pinned = self.pinned()
        if pinned != self._pinned:
            self.node.artifacts.pin_mirrors(pinned)
            self._pinned = pinned

    async def _keep(self, key: str, epoch: int, digest: str, committers: list[str]) -> None:
        try:
            await self.learn_addresses(committers)
            async with self._fetching:
                room = await self.node.artifacts.room_within(MIRROR_SHARE, self.pinned())
                _, artifact = await fetch_checked_artifact(self.node, committers, key, digest, max_bytes=room)
                self.kept[(key, digest)] = artifact
                self._pin()   # not evicted while it may be the task's only copy
        except ArtifactTooLarge as exc:   # kept off for good: the task's other holders still serve it
            self.refused += 1
            log.warning("task %s: epoch %d's state not mirrored: the mirrors' share of the artifact store "
                        "([artifacts] quota_mb x %g) is full: %s", key[:16], epoch + 1, MIRROR_SHARE, exc)
            return
        except (StateUnavailable, ConnectionError, OSError) as exc:
            log.info("task %s: epoch %d's state not mirrored yet: %s", key[:16], epoch + 1, exc)
            await asyncio.sleep(RETRY_S)
            self.started.discard((key, digest))
            return
        job = self.board.jobs.get(key)
        if job is None:
            self.board.start(key, state=JobState.MIRRORING, workers=[], epoch_states={digest: artifact})
        else:   # our own job of it (we also train it), or the states mirrored so far
            self.board.update(key, epoch_states={**(job.get("epoch_states") or {}), digest: artifact})
        log.info("task %s: mirroring epoch %d's state %s", key[:16], epoch + 1, digest[:16])


def mirror_only(job: dict | None) -> bool:
    """Whether a board job is only a mirror of a task's states (the node may still be named to its crew)."""
    return job is not None and job.get("state") in (JobState.MIRRORING, JobState.MIRRORED)

"""Verifiers keep a copy of each closed epoch's committed state, so a task's last state outlives its crew
(docs/adr/0236).

Only the workers that committed an epoch's state held it (docs/adr/0211, 0232): a crew that died and never
came back took the task's last state with it, so no new crew could start from it (the restarts ran out) and
the owner could not fetch its weights. Now each verifier drawn for an epoch's audit slots (they are online,
staked, and named on the ledger) fetches that epoch's state as soon as the slots are drawn, checks its
sha256 against the committed digest, and serves it like a worker does: over the progress protocol, its
board's ``epoch_states`` (digest -> artifact id) for the task, from its artifact store. `holders_of`
(ml/compute/epoch_states.py) lists these mirrors after the committers, so a joiner and `task fetch --epoch`
find the state at a mirror when no committer answers. A verifier keeps the latest `MIRROR_EPOCHS` closed
epochs of each task it audits, while the task is active.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from consensus.task_info import TaskInfo, TaskStatus
from ml.compute.epoch_states import StateUnavailable, committed_states, fetch_checked_artifact, mirrors_of
from ml.compute.job_board import JobBoard, JobState

log = logging.getLogger(__name__)

MIRROR_EPOCHS = 2       # the latest closed epochs of a task a verifier keeps
RETRY_S = 10.0          # a state no committer served yet is asked for again after this


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

    def look(self, task: TaskInfo) -> None:
        """Keep what ``owed`` names; once the task ended, the mirror's job ends too (its files stay for the
        store's retention: the owner may still fetch an epoch)."""
        job = self.board.jobs.get(task.task_id)
        if task.status not in TaskStatus.ACTIVE and mirror_only(job):
            self.board.update(task.task_id, state=JobState.MIRRORED)
        for epoch, digest, committers in owed(task, self.node.peer_id):
            if (task.task_id, digest) not in self.started:
                self.started.add((task.task_id, digest))
                self.spawn(self._keep(task.task_id, epoch, digest, committers))

    async def _keep(self, key: str, epoch: int, digest: str, committers: list[str]) -> None:
        try:
            await self.learn_addresses(committers)
            _, artifact = await fetch_checked_artifact(self.node, committers, key, digest)
            await self.node.artifacts.retain(artifact)   # not evicted while it may be the task's only copy
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

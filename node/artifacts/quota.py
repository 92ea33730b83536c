"""The artifact store's total disk quota, and eviction of what no open task needs (issue 22).

A node keeps at most ``quota`` bytes of artifacts (complete files and partial downloads; each one is
also at most the store's ``max_size``). Before a new artifact is added or a download starts, the
store asks ``make_room``, which deletes artifacts nothing pins, oldest first, until the new one fits.
Pinned:

- the artifacts of open tasks this node works on, audits or owns: their model, dataset and eval files
  and the results committed for them (``task_pins`` reads them from the ledger's task list; the
  compute role hands them over each tick with ``set_task_pins``);
- what this node made itself (its results and segment checkpoints, added with ``add_file`` or
  ``add_bytes``; marked in ``own/``) for ``retention_s`` after it was made, so an owner can still
  fetch a result after its task is paid;
- the epoch states a verifier mirrors (``set_mirror_pins``: the latest closed epochs of the open tasks
  it audits, ml/compute/state_mirror.py), which take at most a share of the quota;
- downloads in progress.

When pinned artifacts leave no room, the new artifact is refused (``QuotaFull``, saying how much is
pinned) and nothing pinned is deleted. Methods block (the store calls them in its thread).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ArtifactError
from .merkle import ID_PATTERN

if TYPE_CHECKING:
    from .store import ArtifactStore

log = logging.getLogger(__name__)

ENDED_TASKS = frozenset({"paid", "stopped", "rejected", "expired", "cancelled", "failed"})
SOURCE_FIELDS = ("model_artifact", "dataset_artifact", "eval_artifact")
DEFAULT_RETENTION_S = 7 * 24 * 3600.0


class QuotaFull(ArtifactError):
    """No room for an artifact without deleting pinned ones."""


def _involved(task: dict, me: str) -> bool:
    if me == task.get("owner") or me in (task.get("workers") or []):
        return True
    for slot in task.get("slots") or []:
        if any(v.get("verifier") == me for v in slot.get("verifiers") or []):
            return True
        if any(r.get("referee") == me for r in slot.get("referees") or []):
            return True
    return False


def task_pins(tasks: Iterable[dict], me: str) -> frozenset[str]:
    """The artifacts of the open tasks (``dkb_listTasks`` entries) that `me` owns, works on, verifies or
    referees: their sources and every committed result."""
    pins: set[str] = set()
    for task in tasks:
        if not isinstance(task, dict) or task.get("status") in ENDED_TASKS or not _involved(task, me):
            continue
        spec = task.get("spec")
        if not isinstance(spec, dict):
            spec = {}
        pins.update(str(spec.get(name)) for name in SOURCE_FIELDS if spec.get(name))
        for commit in (task.get("commits") or {}).values():
            if isinstance(commit, list) and len(commit) > 1 and isinstance(commit[1], str):
                pins.add(commit[1])
    return frozenset(p for p in pins if ID_PATTERN.fullmatch(p))


class StoreQuota:
    """Total bytes the store may hold, what is pinned, and eviction of the rest."""

    def __init__(self, root: Path, quota: int, retention_s: float = DEFAULT_RETENTION_S, clock=time.time) -> None:
        if quota <= 0:
            raise ValueError("the artifact quota must be positive")
        self.quota = quota
        self.retention_s = retention_s
        self.clock = clock
        self.own_dir = Path(root) / "own"
        self.own_dir.mkdir(parents=True, exist_ok=True)
        self._task_pins: frozenset[str] = frozenset()
        self._mirror_pins: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self.evicted = 0   # artifacts deleted to make room, since start

    # ---- pins
    def set_task_pins(self, artifacts: Iterable[str]) -> None:
        """Replace the pins of open tasks (see ``task_pins``)."""
        with self._lock:
            self._task_pins = frozenset(artifacts)

    def set_mirror_pins(self, artifacts: Iterable[str]) -> None:
        """Replace the pins of the epoch states this node mirrors (ml/compute/state_mirror.py)."""
        with self._lock:
            self._mirror_pins = frozenset(artifacts)

    def mark_own(self, artifact: str) -> None:
        """`artifact` was made here now: pinned for ``retention_s``."""
        if ID_PATTERN.fullmatch(artifact):
            marker, now = self.own_dir / artifact, self.clock()
            marker.touch()
            os.utime(marker, (now, now))

    def _own_until(self, artifact: str) -> float:
        try:
            return (self.own_dir / artifact).stat().st_mtime + self.retention_s
        except OSError:
            return 0.0

    def pinned(self, artifact: str) -> bool:
        with self._lock:
            if artifact in self._task_pins or artifact in self._mirror_pins:
                return True
        return self._own_until(artifact) > self.clock()

    # ---- room
    def make_room(self, store: ArtifactStore, incoming: int, keep: str = "") -> list[str]:
        """Delete unpinned artifacts (never `keep` or a download in progress), oldest first, until
        `incoming` more bytes fit under the quota; the ids deleted. QuotaFull when they cannot."""
        held = store.held()
        used = sum(size for size, _, _ in held.values())
        if used + incoming <= self.quota:
            return []
        evictable = sorted((mtime, artifact) for artifact, (_, mtime, busy) in held.items()
                           if not busy and artifact != keep and not self.pinned(artifact))
        evicted = []
        for _, artifact in evictable:
            if used + incoming <= self.quota:
                break
            used -= held[artifact][0]
            store.delete(artifact)
            self.forget(artifact)
            evicted.append(artifact)
        self.evicted += len(evicted)
        if evicted:
            log.info("evicted artifacts no open task needs", extra={"count": len(evicted), "held_bytes": used})
        if used + incoming > self.quota:
            raise QuotaFull(f"the artifact store is full: {used} of its {self.quota} bytes ([artifacts] quota_mb) "
                            f"are pinned by open tasks, downloads in progress and this node's own recent results; "
                            f"{incoming} more bytes do not fit")
        return evicted

    def forget(self, artifact: str) -> None:
        with contextlib.suppress(OSError):
            (self.own_dir / artifact).unlink()


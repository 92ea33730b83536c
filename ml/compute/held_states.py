"""The epoch states a worker committed, remembered across its restarts (docs/adr/0232).

A worker keeps each epoch's state file in its artifact store (on disk under its home, kept for the
store's own-artifact retention) and tells where over the progress protocol (the job's ``epoch_states``:
state digest -> artifact id; docs/adr/0211). That pointer lived only in the job board, so a worker that
restarted held the files but could not say where: a crew that died left its task's last committed state
unreachable even when a former member came back. `HeldStates` keeps the pointers in
``<data_dir>/compute/epoch_states.json`` (the `MAX_TASKS` most recent tasks), and `restored_job` turns
them into the job a restarted worker shows for such a task: ended (it does not retrain a share it
committed epochs of: its commitments cannot be repeated), with the pointers, so a joiner of a new crew
and the owner's ``task fetch --epoch`` find the state at a former member again. Reading the file is
bounded: one of more than `MAX_FILE_BYTES`, or entries that are not hex ids, are ignored.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ml.compute.job_board import JobState

log = logging.getLogger(__name__)

FILE_NAME = "epoch_states.json"
MAX_TASKS = 64               # tasks whose pointers are kept (the most recent)
MAX_STATES_PER_TASK = 1024   # digests kept per task (one per committed epoch)
MAX_FILE_BYTES = 4 << 20


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class HeldStates:
    """Task id hex -> {state digest: artifact id} of the epoch states this worker committed."""

    def __init__(self, folder: Path | None) -> None:
        self.path = None if folder is None else folder / FILE_NAME
        self.tasks: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        if self.path is None or not self.path.is_file():
            return
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                raise ValueError(f"over {MAX_FILE_BYTES} bytes")
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable epoch state pointers %s: %s", self.path, exc)
            return
        if not isinstance(doc, dict):
            return
        for key, states in list(doc.items())[-MAX_TASKS:]:
            if _hex64(key) and isinstance(states, dict):
                kept = {d: a for d, a in list(states.items())[:MAX_STATES_PER_TASK] if _hex64(d) and _hex64(a)}
                if kept:
                    self.tasks[key] = kept

    def add(self, key: str, digest: str, artifact: str) -> None:
        """Remember that ``artifact`` holds the state with sha256 ``digest`` of task ``key``, written at once
        (before the commitment that names it is sent: a worker killed right after it still knows)."""
        states = self.tasks.pop(key, {})
        if len(states) < MAX_STATES_PER_TASK:
            states[digest] = artifact
        self.tasks[key] = states
        while len(self.tasks) > MAX_TASKS:
            del self.tasks[next(iter(self.tasks))]
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(FILE_NAME + ".tmp")
            tmp.write_text(json.dumps(self.tasks))
            os.replace(tmp, self.path)
        except OSError as exc:   # the pointer still serves until the node restarts
            log.warning("cannot keep the epoch state pointers in %s: %s", self.path, exc)

    def restored_job(self, key: str, committed: bool) -> dict[str, Any] | None:
        """The job board fields of a task this worker held states of before it restarted (None when it held
        none): ended (``committed`` when the ledger holds its result), serving those states."""
        states = self.tasks.get(key)
        if not states:
            return None
        state = JobState.COMMITTED if committed else JobState.FAILED
        return {"state": state, "epoch_states": dict(states), "workers": [],
                **({} if committed else {"error": "the node restarted during this task: it serves the epoch states "
                                                  "it committed and trains no more of it"})}

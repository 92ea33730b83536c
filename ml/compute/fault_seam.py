"""The one seam through which a compute node misbehaves on purpose: for tests, the verification
benchmark and devtools only (`[compute] fault_inject`, checked by node.config.check_fault_mode).

The compute role reads the configured mode here and nowhere else. `FaultInjection` hands it to the
three places that deviate: the trainer (`trainer_mode`: lazy, partial, poison_*; ml/train/faults.py),
the records a worker commits (`committed_records`: wrong_segments makes up the gradient hashes, copycat
commits and serves another worker's records) and the verifier's answer (`verifier_mode`: false_accuser,
rubber_stamp; ml/compute/verification_flow.py). An honest node has mode "" and each of them is the
identity.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from consensus.task_info import TaskInfo
from ml.compute import segments_protocol
from ml.compute.segment_record import SegmentRecord
from ml.compute.verification_flow import VERIFIER_FAULTS
from ml.train.faults import falsify_records

COPYCAT_WAIT_S = 300.0   # copycat: how long to wait for another worker's commitment


class FaultInjection:
    """The configured adversary mode ("" for an honest node) and what it changes."""

    def __init__(self, mode: str, get_task: Callable[[str], Awaitable[Any]],
                 learn_addresses: Callable[[list[str]], Awaitable[None]], host: Any) -> None:
        self.mode = mode
        self._get_task = get_task
        self._learn_addresses = learn_addresses
        self._host = host

    @property
    def trainer_mode(self) -> str:
        """What the trainer is given (it acts on its own modes, ml.train.faults.MODES and partial:q)."""
        return self.mode

    @property
    def verifier_mode(self) -> str:
        """The adversarial verifier mode, or "" to judge by replay."""
        return self.mode if self.mode in VERIFIER_FAULTS else ""

    async def committed_records(self, task_id: bytes, me: str,
                                records: list[SegmentRecord]) -> tuple[list[SegmentRecord], str]:
        """The records this worker commits to, and whose id their Merkle leaves carry."""
        if self.mode == "wrong_segments":
            return falsify_records(records), me
        if self.mode == "copycat":
            return await self._copy_records(task_id, me)
        return records, me

    async def _copy_records(self, task_id: bytes, me: str) -> tuple[list[SegmentRecord], str]:
        """Another worker's records and its id, once it committed; we then commit its segments_root as ours."""
        key, deadline = task_id.hex(), time.monotonic() + COPYCAT_WAIT_S
        while time.monotonic() < deadline:
            doc = await self._get_task(key)
            task = TaskInfo.from_json(doc) if doc is not None else None
            others = sorted(w for w in (task.commits if task is not None else {}) if w != me)
            if task is not None and others:
                victim, count = others[0], task.commits[others[0]].segments
                await self._learn_addresses([victim])
                answers = [await segments_protocol.fetch_record(self._host, victim, task_id, i, count)
                           for i in range(count)]
                return [a.record for a in answers], victim
            await asyncio.sleep(1.0)
        raise RuntimeError("copycat: no other worker committed in time")

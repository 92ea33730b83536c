"""A compute node's results and the end of its tasks: the committed result of each task it trained
(segment records, roots, weights; kept in ``<data_dir>/compute/<task id>.json`` across restarts, as a
verifier may ask after a restart), served record by record with Merkle proofs over
`/dekube/segments` (v2), and the `finalize` transaction, sent at most once per FINALIZE_RETRY_MS of
block time per task."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ml.compute import segments_protocol
from ml.compute.segment_record import BadRecord, SegmentRecord, leaves, proof
from node.ledger import LedgerGateway, TxFailed

log = logging.getLogger(__name__)

FINALIZE_RETRY_MS = 15_000   # block time between two finalize attempts of one task


class ResultStore:
    """Task id hex -> our committed result ({"records", "leaf_worker", "segments_root", ...})."""

    def __init__(self, folder: Path | None, me: str) -> None:
        self.folder = folder
        self.me = me
        self.results: dict[str, dict[str, Any]] = {}
        self.leaves: dict[str, list[bytes]] = {}   # task id hex -> Merkle leaves of the served records

    def load(self) -> None:
        if self.folder is None or not self.folder.is_dir():
            return
        for path in self.folder.glob("*.json"):
            if len(path.stem) != 64:   # results are named by task id (bandwidth.json is not one)
                continue
            try:
                self.results[path.stem] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("ignoring unreadable result %s: %s", path, exc)

    def save(self, key: str, result: dict[str, Any]) -> None:
        self.results[key] = result
        self.leaves.pop(key, None)   # the records grew (an epoch's were added): the leaves are built again
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f"{key}.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, self.folder / f"{key}.json")

    def leaf_worker(self, key: str) -> str:
        """The peer ID the leaves of our result for task `key` (hex) were made with."""
        leaf_worker = (self.results.get(key) or {}).get("leaf_worker")
        return leaf_worker if isinstance(leaf_worker, str) and leaf_worker else self.me

    def record_for(self, task_id: bytes, index: int, segments: int) -> segments_protocol.SegmentAnswer | None:
        """Our record of segment `index` of a task we committed, with its Merkle proof under our commitment
        of `segments` segments (an epoch's covers the records up to it, docs/adr/0230)."""
        key = task_id.hex()
        result = self.results.get(key)
        if result is None or not isinstance(result.get("records"), list) or not result["records"]:
            return None
        try:
            first = SegmentRecord.from_obj(result["records"][0]).index   # 0, or a joiner's first segment
            if not first <= index < segments <= first + len(result["records"]):
                return None
            if key not in self.leaves:
                records = [SegmentRecord.from_obj(r) for r in result["records"]]
                self.leaves[key] = leaves(task_id, result.get("leaf_worker") or self.me, records)
            record = SegmentRecord.from_obj(result["records"][index - first])
        except BadRecord as exc:
            log.warning("cannot serve the records of task %s: %s", key, exc)
            return None
        leaf_list = self.leaves[key][:segments - first]
        return segments_protocol.SegmentAnswer(record, proof(leaf_list, index - first), len(leaf_list))


class Finalizer:
    """Sends `finalize` for tasks this node is party to, no more often than FINALIZE_RETRY_MS apart."""

    def __init__(self, ledger: LedgerGateway) -> None:
        self.ledger = ledger
        self.next_at: dict[str, int] = {}   # task id hex -> block time of the next finalize attempt

    def not_before(self, key: str, time_ms: int) -> None:
        """Do not try `key` before block time `time_ms` (unless a time is already set)."""
        self.next_at.setdefault(key, time_ms)

    def due_now(self, key: str) -> None:
        """Try `key` at the next look, whatever the retry time."""
        self.next_at.pop(key, None)

    def next_attempt(self, key: str, default: int) -> int:
        return self.next_at.get(key, default)

    async def finalize(self, key: str, now: int) -> None:
        """Send finalize for `key`, at most once per FINALIZE_RETRY_MS of block time (the ledger refuses
        it while commits or audits may still come, and only one finalize per task succeeds)."""
        if now < self.next_at.get(key, 0):
            return
        self.next_at[key] = now + FINALIZE_RETRY_MS
        try:
            await self.ledger.send("finalize", {"task_id": bytes.fromhex(key)})
            log.info("finalized task %s", key)
        except TxFailed as exc:  # another node finalized first, or it is too early
            log.info("finalize %s not applied: %s", key, exc)

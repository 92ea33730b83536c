"""Reaching a task's peers and getting its inputs: learn a peer's addresses from its ledger record
(direct ones first, then relayed ones, so NAT'd workers are reached through their relays), and fetch
a task's input artifacts from its owner's sources and the given peers (co-workers, or committed
workers, which serve what they fetched), with the fetch's progress on the job board."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from consensus.task_info import TaskInfo
from ml.compute.job_board import JobBoard
from ml.compute.task_inputs import fetch_inputs, source_peers
from ml.train.inputs import artifact_ids
from node.ledger import LedgerGateway
from node.p2p.errors import ProtocolError

log = logging.getLogger(__name__)


class PeerFetch:
    """Addresses of peers and the input files of tasks, for training and for judging."""

    def __init__(self, node: Any, ledger: LedgerGateway, board: JobBoard, meter: Any) -> None:
        self.node = node
        self.ledger = ledger
        self.board = board
        self._meter = meter   # () -> the node's bandwidth meter or None

    async def learn_addresses(self, peers: list[str]) -> None:
        for peer in peers:
            info = await self.ledger.call("dkb_getNode", peer)
            # direct addresses first; relayed ones let NAT'd workers be reached through their relays
            addrs = (info.get("listen_addrs") or []) + (info.get("relay_addrs") or []) if info else []
            if addrs:
                self.add_addrs(peer, addrs)

    def add_addrs(self, peer: str, addrs: list[str]) -> None:
        try:
            self.node.host.peerbook.add_addrs(peer, addrs)
        except (ValueError, ProtocolError) as exc:
            log.warning("bad addresses for %s: %s", peer, exc)

    async def task_inputs(self, key: str | None, task: TaskInfo, spec: Any, peers: list[str]) -> dict[str, Path]:
        """The task's input artifacts as local files, fetched (when not held) from the task's sources
        and `peers`; with `key`, the fetch's progress goes on that job."""
        ids = artifact_ids(spec)
        if not ids:
            return {}
        me = self.node.peer_id
        sources = {peer: addrs for peer, addrs in source_peers(list(task.sources)).items() if peer != me}
        for peer, addrs in sources.items():
            self.add_addrs(peer, addrs)
        others = [p for p in peers if p != me and p not in sources]
        await self.learn_addresses(others)
        progress = None
        if key is not None:
            job_key = key
            self.board.update(job_key, state="fetching inputs", fetched_bytes=0, fetch_total=0)

            def progress(done: int, total: int) -> None:
                self.board.update(job_key, fetched_bytes=done, fetch_total=total)

        result: dict[str, Path] = await fetch_inputs(self.node.artifacts, ids, [*sources, *others], progress,
                                                     self._meter())
        return result

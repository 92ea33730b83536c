"""`/dekube/task-ready/1`: a start barrier so no worker sends all-reduce frames to a peer whose group
for the task is not listening yet (that peer would look faulty and be dropped from the round).

Request: the 32-byte task id; response: one byte, 1 when the answering node's group for that task is
started, 0 otherwise. `wait_until_ready` asks every other worker until all say 1 or the deadline
passes (TaskNotReady).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from node.p2p.errors import ProtocolError

PROTOCOL = "/dekube/task-ready/1"
TASK_ID_BYTES = 32
ASK_TIMEOUT_S = 5.0
RETRY_S = 0.3


class TaskNotReady(TimeoutError):
    """Some workers (``waiting``) did not start their group for the task before the deadline."""

    def __init__(self, message: str, waiting: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.waiting = waiting


def make_handler(is_ready: Callable[[bytes], bool]):
    async def serve_ready(stream) -> None:
        try:
            task_id = await asyncio.wait_for(stream.readexactly(TASK_ID_BYTES), ASK_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError):
            stream.reset()
            return
        await stream.write(b"\x01" if is_ready(task_id) else b"\x00")
        await stream.close()

    return serve_ready


async def ask_ready(host, peer_id: str, task_id: bytes) -> bool:
    """True when `peer_id` answers that its group for `task_id` is started; False on 0 or any failure."""
    async def exchange() -> bool:
        stream = await host.open_stream(peer_id, PROTOCOL)
        try:
            await stream.write(task_id)
            return await stream.readexactly(1) == b"\x01"
        finally:
            await stream.close()

    try:
        return await asyncio.wait_for(exchange(), ASK_TIMEOUT_S)
    except (TimeoutError, asyncio.IncompleteReadError, OSError, ProtocolError):
        return False


async def ready_among(host, peers: list[str], task_id: bytes, timeout: float) -> list[str]:
    """Those of ``peers`` whose group for ``task_id`` is started by the deadline (asked until all are)."""
    try:
        await wait_until_ready(host, peers, task_id, timeout)
        return sorted(peers)
    except TaskNotReady as exc:
        return sorted(set(peers) - exc.waiting)


async def wait_until_ready(host, peers: list[str], task_id: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = set(peers)
    while waiting:
        answers = await asyncio.gather(*(ask_ready(host, peer, task_id) for peer in sorted(waiting)))
        waiting -= {peer for peer, ready in zip(sorted(waiting), answers) if ready}
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TaskNotReady(f"workers not ready after {timeout:g} s: {sorted(waiting)}", frozenset(waiting))
        await asyncio.sleep(RETRY_S)

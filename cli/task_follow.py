"""Following one task to its end: status changes from the ledger's ``tasks`` events, live progress
straight from the workers over the p2p network (``/dekube/task-progress/1.0.0``, which crosses NAT
through relays like any stream), never by polling validators.

``follow_task`` returns the final task (paid, cancelled, rejected, expired or failed). With a client node
it follows every assigned worker's progress stream (restarting one that broke, while the task
lives); ``on_held`` is called once, when a worker reports it is training, i.e. holds the task's
artifacts, so the owner's own copy is no longer needed.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from cli.errors import CliError
from cli.task_ledger import FINAL, call, task_states
from cli.task_view import TaskView, short
from consensus.state.retention import unknown_task_message
from consensus.task_info import TaskInfo
from ml.compute.job_board import JobState

log = logging.getLogger(__name__)

RETRY_S = 2.0
# a worker's job states (ml/compute/training.py) once it has fetched the task's files
HOLDING_STATES = ("dry run", "waiting for workers", "training", "committing", JobState.COMMITTED)


async def learn_addresses(pool, node, peers: list[str]) -> list[str]:
    """Puts each peer's registered addresses (direct, then relayed) in the node's peerbook; returns
    the peers that have any."""
    known = []
    for peer in peers:
        info = await call(pool, "dkb_getNode", peer)
        addrs = ((info.get("listen_addrs") or []) + (info.get("relay_addrs") or [])) if info else []
        if not addrs:
            continue
        try:
            node.host.peerbook.add_addrs(peer, addrs)
        except ValueError as exc:
            log.warning("bad addresses registered by %s: %s", peer, exc)
            continue
        known.append(peer)
    return known


async def follow_worker(node, peer: str, task_id: str, view: TaskView, held: Callable[[str], None]) -> None:
    """Progress reports of ``peer``'s share of the task until its job ends, reconnecting after errors."""
    from ml.compute.progress_protocol import follow_progress

    while True:
        try:
            async for report in follow_progress(node.host, peer, bytes.fromhex(task_id)):
                if not isinstance(report, dict):
                    continue
                if report.get("state") in HOLDING_STATES or (report.get("step") or 0) > 0:
                    held(peer)
                view.report(peer, report)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # an unreachable or departed worker: the others still report
            log.info("progress from %s: %s: %s", peer, type(exc).__name__, exc)
        await asyncio.sleep(RETRY_S)


async def follow_task(pool, task_id: str, view: TaskView, *, node=None, timeout: float = 600.0,
                      on_held: Callable[[str], None] | None = None) -> TaskInfo:
    followers: dict[str, asyncio.Task] = {}
    held_by: list[str] = []

    def held(peer: str) -> None:
        if not held_by:
            held_by.append(peer)
            if on_held is not None:
                on_held(peer)

    task = None
    try:
        async with asyncio.timeout(timeout):
            async for task in task_states(pool, task_id):
                view.status(task)
                if task is None or node is None or task.status in FINAL:
                    continue
                new = [w for w in task.workers if w not in followers]
                for peer in await learn_addresses(pool, node, new) if new else []:
                    followers[peer] = asyncio.create_task(follow_worker(node, peer, task_id, view, held),
                                                          name=f"progress-{short(peer)}")
    except TimeoutError:
        status = task.status if task else "not in a block"
        raise CliError(f"task {task_id} still {status} after {timeout:g} s (it goes on; follow it with "
                       f"`dekube-node task watch {task_id}`)") from None
    finally:
        for follower in followers.values():
            follower.cancel()
        for follower in followers.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower
        view.close()
    if task is None:
        raise CliError(unknown_task_message(task_id))
    return task

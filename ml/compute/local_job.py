"""`run_local_nodes(spec, world)`: train among `world` local processes that talk over the node's p2p
stack (`ml.compute.local_worker`), without a ledger: what `dekube-node task run` does.

The parent hands out the spec, gathers each worker's peer id and addresses, sends everyone the
address book, relays progress events and sends shutdown once all are done. A worker error, early exit
or the timeout kills every worker and raises LocalJobFailed; no process outlives the call.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

import ml
from ml.train.spec import TrainSpec

REPO_ROOT = Path(ml.__file__).resolve().parent.parent
MAX_LINE = 1 << 22


class LocalJobFailed(RuntimeError):
    """A worker failed or exited early, or the job timed out."""


async def run_local_nodes(spec: TrainSpec, world: int, *, mode: str = "butterfly", timeout: float = 900,
                          on_event: Callable[[dict], None] | None = None) -> list[dict]:
    """Each worker's "done" summary (with its `peer_id`), in process order."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    procs = []
    try:
        for rank in range(world):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ml.compute.local_worker", "--rank", str(rank), "--mode", mode,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env, cwd=str(REPO_ROOT), limit=MAX_LINE))
        return await asyncio.wait_for(_drive(procs, spec, on_event), timeout)
    except asyncio.TimeoutError:
        raise LocalJobFailed(f"job did not finish within {timeout:g} s") from None
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        for proc in procs:
            with contextlib.suppress(Exception):
                await proc.wait()


async def _read_event(proc, rank: int) -> dict:
    line = await proc.stdout.readline()
    if not line:
        await proc.wait()
        stderr = (await proc.stderr.read())[-2000:].decode(errors="replace")
        raise LocalJobFailed(f"worker {rank} exited with {proc.returncode} without reporting: {stderr}")
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise LocalJobFailed(f"worker {rank} printed a non-JSON line: {line[:200]!r}") from None
    if event.get("event") == "error":
        raise LocalJobFailed(f"worker {rank} failed: {event.get('message')}")
    return event


async def _send(proc, message: dict) -> None:
    proc.stdin.write((json.dumps(message) + "\n").encode())
    await proc.stdin.drain()


async def _drive(procs, spec: TrainSpec, on_event) -> list[dict]:
    for proc in procs:
        await _send(proc, spec.to_dict())
    peers = {}
    for rank, proc in enumerate(procs):
        event = await _read_event(proc, rank)
        if event.get("event") != "listening":
            raise LocalJobFailed(f"worker {rank} sent {event.get('event')!r} before listening")
        peers[event["peer_id"]] = event["addrs"]
    for proc in procs:
        await _send(proc, {"peers": peers})

    async def follow(rank: int, proc) -> dict:
        while True:
            event = await _read_event(proc, rank)
            if on_event is not None:
                on_event(event)
            if event.get("event") == "done":
                return event

    tasks = [asyncio.create_task(follow(rank, proc)) for rank, proc in enumerate(procs)]
    try:
        results = list(await asyncio.gather(*tasks))
        for proc in procs:
            await _send(proc, {"shutdown": True})
        for proc in procs:
            await proc.wait()
        return results
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

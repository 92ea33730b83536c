"""Start a training job as `world` local worker processes on 127.0.0.1 and collect the results.

The parent hands each worker the spec, gathers their listening addresses, sends everyone the address
book, then relays progress events until every worker is done. Any worker error, early exit or the
overall timeout kills all workers and raises JobFailed; no process outlives the call. Workers exit
only after the parent's shutdown message, sent once all of them are done.
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
MAX_LINE = 1 << 20


class JobFailed(RuntimeError):
    """A local job did not finish: a worker failed, exited early, or the job timed out."""


async def run_local_job(spec: TrainSpec, world: int, *, mode: str = "butterfly", timeout: float = 600,
                        on_event: Callable[[dict], None] | None = None) -> list[dict]:
    """Train `spec` with `world` worker processes; returns each worker's "done" summary by rank."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    procs = []
    try:
        for rank in range(world):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ml.job.worker", "--rank", str(rank), "--world", str(world),
                "--mode", mode, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=str(REPO_ROOT), limit=MAX_LINE))
        return await asyncio.wait_for(_drive(procs, spec, on_event), timeout)
    except asyncio.TimeoutError:
        raise JobFailed(f"job did not finish within {timeout} s") from None
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
        raise JobFailed(f"worker {rank} exited with {proc.returncode} without reporting: {stderr}")
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise JobFailed(f"worker {rank} printed a non-JSON line: {line[:200]!r}") from None
    if event.get("event") == "error":
        raise JobFailed(f"worker {rank} failed: {event.get('message')}")
    return event


def _send(proc, message: dict) -> None:
    proc.stdin.write((json.dumps(message) + "\n").encode())


async def _drive(procs, spec: TrainSpec, on_event) -> list[dict]:
    for proc in procs:
        _send(proc, spec.to_dict())
    addresses = {}
    for rank, proc in enumerate(procs):
        event = await _read_event(proc, rank)
        if event.get("event") != "listening":
            raise JobFailed(f"worker {rank} sent {event.get('event')!r} before listening")
        addresses[f"worker-{rank}"] = event["address"]
    for proc in procs:
        _send(proc, {"addresses": addresses})
        await proc.stdin.drain()

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
            _send(proc, {"shutdown": True})
            await proc.stdin.drain()
        for proc in procs:
            await proc.wait()
        return results
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

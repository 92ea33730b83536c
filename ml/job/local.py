"""Start a training job as `world` local worker processes on 127.0.0.1 and collect the results.

The parent hands each worker the spec, gathers what each reports when listening, sends everyone the
resulting directory (who to reach where), then relays progress events until every worker is done.
Any worker error, early exit or the overall timeout kills all workers and raises JobFailed; no
process outlives the call. Workers exit only after the parent's shutdown message, sent once all of
them are done. `run_worker_processes` is the driver shared with `ml.compute.local_job`, whose workers
talk over the node's p2p stack instead of plain TCP.
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


class JobFailed(RuntimeError):
    """A local job did not finish: a worker failed, exited early, or the job timed out."""


async def run_local_job(spec: TrainSpec, world: int, *, mode: str = "butterfly", timeout: float = 600,
                        on_event: Callable[[dict], None] | None = None) -> list[dict]:
    """Train `spec` with `world` worker processes; returns each worker's "done" summary by rank."""
    return await run_worker_processes(
        spec, world,
        argv=lambda rank: ["-m", "ml.job.worker", "--rank", str(rank), "--world", str(world), "--mode", mode],
        directory=lambda listening: {"addresses": {f"worker-{rank}": event["address"]
                                                   for rank, event in enumerate(listening)}},
        timeout=timeout, on_event=on_event)


async def run_worker_processes(spec: TrainSpec, world: int, *, argv: Callable[[int], list[str]],
                               directory: Callable[[list[dict]], dict], timeout: float,
                               on_event: Callable[[dict], None] | None = None,
                               failure: type[JobFailed] = JobFailed) -> list[dict]:
    """Run `python <argv(rank)>` for each rank, drive the spec / listening / directory / done
    exchange over their stdin and stdout (JSON lines), and return each "done" event by rank."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    procs = []
    try:
        for rank in range(world):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, *argv(rank), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=str(REPO_ROOT), limit=MAX_LINE))
        return await asyncio.wait_for(_drive(procs, spec, directory, on_event, failure), timeout)
    except asyncio.TimeoutError:
        raise failure(f"job did not finish within {timeout:g} s") from None
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        for proc in procs:
            with contextlib.suppress(Exception):
                await proc.wait()


async def _read_event(proc, rank: int, failure: type[JobFailed]) -> dict:
    line = await proc.stdout.readline()
    if not line:
        await proc.wait()
        stderr = (await proc.stderr.read())[-2000:].decode(errors="replace")
        raise failure(f"worker {rank} exited with {proc.returncode} without reporting: {stderr}")
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise failure(f"worker {rank} printed a non-JSON line: {line[:200]!r}") from None
    if event.get("event") == "error":
        raise failure(f"worker {rank} failed: {event.get('message')}")
    return event


async def _send(proc, message: dict) -> None:
    proc.stdin.write((json.dumps(message) + "\n").encode())
    await proc.stdin.drain()


async def _drive(procs, spec: TrainSpec, directory, on_event, failure) -> list[dict]:
    for proc in procs:
        await _send(proc, spec.to_dict())
    listening = []
    for rank, proc in enumerate(procs):
        event = await _read_event(proc, rank, failure)
        if event.get("event") != "listening":
            raise failure(f"worker {rank} sent {event.get('event')!r} before listening")
        listening.append(event)
    for proc in procs:
        await _send(proc, directory(listening))

    async def follow(rank: int, proc) -> dict:
        while True:
            event = await _read_event(proc, rank, failure)
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

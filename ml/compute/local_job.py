"""Run a training job as `world` local worker processes on 127.0.0.1 (`ml.compute.local_worker`)
and collect the results: what `dekube-node task run` does (over the node's p2p stack), and what tests
and simulations run over plain TCP (`transport="tcp"`, workers named "worker-<rank>").

The parent hands each worker the spec, gathers what each reports when listening (its peer name and
addresses), sends everyone the resulting directory (who to reach where), then relays progress events
until every worker is done or gone. A worker that dies, fails or breaks the protocol once training has
begun leaves the job: it is killed if still running, reported as a "departed" event, and the others
finish among themselves (the all-reduce redoes the round without it). A worker still running when
the others have finished without it (the finished workers' records show it missing from a round:
stalled, or stopped), or the last one running when none finished, leaves the same way. The job fails
(JobFailed) when a worker is lost before training starts, when no worker finishes, or on the overall
timeout; no process outlives the call. Workers exit only after the parent's shutdown message, sent
once all of them are done or gone. `run_worker_processes` is that driver for any worker command line.

Each finished worker's summary gains "departures": for every worker that left, its peer name, the
all-reduce round it was first missing from and the step the survivors had reached then (from the
worker's own record, which a replay follows: `devtools.job_replay.replay_job(..., left=...)`), why it
left and the last step it reported.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import ml
from ml.job.participation import InconsistentRecord, departure_step, departures
from ml.train.spec import TrainSpec

REPO_ROOT = Path(ml.__file__).resolve().parent.parent
MAX_LINE = 1 << 22
MIN_PARTICIPANTS = 2   # the all-reduce groups of every job (ml.compute.executor.make_group)
TRANSPORTS = ("p2p", "tcp")   # what the workers talk over (ml.compute.local_worker)


class JobFailed(RuntimeError):
    """A local job did not finish: a worker was lost before training, none finished, or it timed out."""


class WorkerLost(Exception):
    """A worker process died, reported an error or broke the line protocol."""


async def run_local_job(spec: TrainSpec, world: int, *, transport: str = "p2p", mode: str = "butterfly",
                        timeout: float = 900, on_event: Callable[[dict], None] | None = None) -> list[dict]:
    """Train `spec` with `world` worker processes over `transport` ("p2p" or "tcp"); returns the "done"
    summary (with its "peer" and the job's "departures") of every worker that finished, in process
    order. A worker that dies mid-job leaves it and the others finish without it."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
    return await run_worker_processes(
        spec, world,
        argv=lambda rank: ["-m", "ml.compute.local_worker", "--rank", str(rank), "--world", str(world),
                           "--mode", mode, "--transport", transport],
        directory=lambda listening: {"peers": {event["peer"]: event["addrs"] for event in listening}},
        timeout=timeout, on_event=on_event)


async def run_worker_processes(spec: TrainSpec, world: int, *, argv: Callable[[int], list[str]],
                               directory: Callable[[list[dict]], dict], timeout: float,
                               on_event: Callable[[dict], None] | None = None,
                               failure: type[JobFailed] = JobFailed) -> list[dict]:
    """Run `python <argv(rank)>` for each rank, drive the spec / listening / directory / done
    exchange over their stdin and stdout (JSON lines), and return the "done" event of each worker
    that finished, by rank, each with the job's "departures"."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    procs = []
    try:
        for rank in range(world):
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, *argv(rank), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=str(REPO_ROOT), limit=MAX_LINE))
        return await asyncio.wait_for(_drive(procs, spec, directory, on_event or (lambda event: None), failure),
                                      timeout)
    except TimeoutError:
        raise failure(f"job did not finish within {timeout:g} s") from None
    finally:
        for proc in procs:
            _kill(proc)
        for proc in procs:
            with contextlib.suppress(Exception):
                await proc.wait()


def _kill(proc) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


async def _read_event(proc, rank: int) -> dict:
    line = await proc.stdout.readline()
    if not line:
        await proc.wait()
        stderr = (await proc.stderr.read())[-2000:].decode(errors="replace").strip()
        raise WorkerLost(f"worker {rank} exited with {proc.returncode} without reporting"
                         + (f": {stderr}" if stderr else ""))
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise WorkerLost(f"worker {rank} printed a non-JSON line: {line[:200]!r}") from None
    if not isinstance(event, dict):
        raise WorkerLost(f"worker {rank} printed {line[:200]!r}, not a JSON object")
    if event.get("event") == "error":
        raise WorkerLost(f"worker {rank} failed: {event.get('message')}")
    return event


async def _send(proc, message: dict) -> None:
    proc.stdin.write((json.dumps(message) + "\n").encode())
    await proc.stdin.drain()


async def _drive(procs, spec: TrainSpec, directory, on_event, failure) -> list[dict]:
    listening = []
    try:
        for proc in procs:
            await _send(proc, spec.to_dict())
        for rank, proc in enumerate(procs):
            event = await _read_event(proc, rank)
            if event.get("event") != "listening" or not isinstance(event.get("peer"), str):
                raise WorkerLost(f"worker {rank} sent {event.get('event')!r} before listening")
            on_event(event)
            listening.append(event)
        for proc in procs:
            await _send(proc, directory(listening))
    except (WorkerLost, ConnectionError) as exc:
        raise failure(f"job lost a worker before training began: {exc}") from None
    peers = [event["peer"] for event in listening]
    last_step: dict[str, int | None] = dict.fromkeys(peers)
    lost: dict[str, str] = {}

    def leave(rank: int, reason: str) -> None:
        _kill(procs[rank])  # a worker that broke the protocol must not go on in the all-reduce either
        lost[peers[rank]] = reason
        on_event({"event": "departed", "rank": rank, "peer": peers[rank], "reason": reason,
                  "last_step": last_step[peers[rank]]})

    async def follow(rank: int, proc) -> dict | None:
        try:
            while True:
                event = await _read_event(proc, rank)
                if event.get("event") == "progress":
                    last_step[peers[rank]] = event.get("step")
                on_event(event)
                if event.get("event") == "done":
                    return event
        except WorkerLost as exc:
            leave(rank, str(exc))
            return None

    following = {asyncio.create_task(follow(rank, proc)): rank for rank, proc in enumerate(procs)}
    results: dict[int, dict] = {}
    try:
        while following:
            completed, _ = await asyncio.wait(following, return_when=asyncio.FIRST_COMPLETED)
            for task in completed:
                rank = following.pop(task)
                done = task.result()
                if done is not None:
                    results[rank] = done
            excluded = _excluded(results.values(), peers, failure)
            if not results and len(following) == 1 < len(procs):
                # an all-reduce round needs two members (MIN_PARTICIPANTS), so a lone worker cannot
                # finish; it fails by itself at its next round unless it is stalled or stopped
                for task, rank in following.items():
                    task.cancel()
                    leave(rank, f"worker {rank} was the only one left, and a round needs {MIN_PARTICIPANTS}; killed")
                break
            if results and all(peers[rank] in excluded for rank in following.values()):
                # the finished workers trained on without these (stalled, or stopped): nothing they
                # could still do changes the result
                for task, rank in following.items():
                    task.cancel()
                    leave(rank, f"worker {rank} was excluded from round {excluded[peers[rank]]} and still "
                                "running after the others finished; killed")
                break
    finally:
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
    finished = [(procs[rank], results[rank]) for rank in sorted(results)]
    if not finished:
        raise failure("no worker finished: " + "; ".join(lost[peer] for peer in peers if peer in lost))
    for proc, _ in finished:
        with contextlib.suppress(ConnectionError):
            await _send(proc, {"shutdown": True})
    for proc, _ in finished:
        await proc.wait()
    for _, done in finished:
        done["departures"] = _departures(spec, peers, done.get("short_rounds", []), lost, last_step)
    return [done for _, done in finished]


def _excluded(summaries, peers: list[str], failure: type[JobFailed]) -> dict[str, int]:
    """{peer: first round it was missing from} over the finished workers' records."""
    excluded: dict[str, int] = {}
    try:
        for summary in summaries:
            for peer, round_id in departures(summary.get("short_rounds", []), peers).items():
                excluded[peer] = min(round_id, excluded.get(peer, round_id))
    except InconsistentRecord as exc:
        raise failure(f"a worker reported impossible round memberships: {exc}") from None
    return excluded


def _departures(spec: TrainSpec, peers: list[str], short_rounds: list, lost: dict[str, str],
                last_step: dict[str, int | None]) -> list[dict]:
    """One finished worker's view of who left: the round (and step) from its record; why, from ours.
    A worker lost after the last round has no round (the results do not depend on it)."""
    recorded = departures(short_rounds, peers)
    return [{"peer": peer, "round": recorded.get(peer),
             "step": departure_step(spec, recorded[peer]) if peer in recorded else None,
             "reason": lost.get(peer, "left a round (reported by the survivors)"), "last_step": last_step[peer]}
            for peer in peers if peer in recorded or peer in lost]

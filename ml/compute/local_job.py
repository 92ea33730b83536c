"""`run_local_nodes(spec, world)`: train among `world` local processes that talk over the node's p2p
stack (`ml.compute.local_worker`), without a ledger: what `dekube-node task run` does.

The process driving (spec, listening, address book, progress, shutdown; nothing outlives the call)
is `ml.job.local.run_worker_processes`; here the directory maps each worker's peer ID to its
listen addresses.
"""
from __future__ import annotations

from collections.abc import Callable

from ml.job.local import JobFailed, run_worker_processes
from ml.train.spec import TrainSpec


class LocalJobFailed(JobFailed):
    """A worker was lost before training began, no worker finished, or the job timed out."""


async def run_local_nodes(spec: TrainSpec, world: int, *, mode: str = "butterfly", timeout: float = 900,
                          on_event: Callable[[dict], None] | None = None) -> list[dict]:
    """The "done" summary (with its `peer_id` and the job's "departures") of each worker that finished,
    in process order; a worker that dies mid-job leaves it and the others finish without it."""
    return await run_worker_processes(
        spec, world,
        argv=lambda rank: ["-m", "ml.compute.local_worker", "--rank", str(rank), "--mode", mode],
        directory=lambda listening: {"peers": {event["peer"]: event["addrs"] for event in listening}},
        timeout=timeout, on_event=on_event, failure=LocalJobFailed)

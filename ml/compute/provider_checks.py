"""What can keep a provider's node from earning, each as one sentence saying what is wrong and what to do
(docs/adr/0198): no GPU where CUDA was asked for, an NVIDIA driver torch cannot use, the p2p port taken
by another program, this machine's clock far from the chain's, a stake below the chain's floor or too
small for the network's tasks. ``dekube-node provide`` stops on them before it bonds or starts (a
genesis hash mismatch and too little balance are refused in cli/networks.py and cli/provide.py); the
running compute node shows the clock and stake ones on its dashboard (``problems``). Pure functions
except ``port_problem``, which binds the port for a moment, and ``problems``, which asks the ledger."""
from __future__ import annotations

import dataclasses
import errno
import socket
import time
from typing import Any

from consensus.genesis import Params
from consensus.state.tasks import stake_for_pay, worker_share
from consensus.task_info import TaskInfo
from node.p2p.multiaddr import Multiaddr, MultiaddrError

MAX_CLOCK_SKEW_MS = 30_000   # blocks come every second or so: a larger gap is this machine's clock (or a stall)


def gpu_problem(device: str, found: dict) -> str | None:
    """With ``--device cuda``: why this machine cannot lend a GPU, or None."""
    if device != "cuda" or found.get("gpu"):
        return None
    error = str(found.get("error") or "")
    if "driver" in error.lower():
        return (f"the NVIDIA driver does not work with this torch ({error.strip()[:200]}): install the driver "
                "version torch's CUDA build needs (nvidia-smi shows the installed one), or run with --device cpu")
    return ("no GPU found: torch sees no CUDA device (is the NVIDIA driver installed, does nvidia-smi list the "
            "card, is torch a CUDA build?): fix that, or run with --device cpu to lend the CPU")


def clock_problem(block_time_ms: int, now_ms: int) -> str | None:
    """Why this machine's clock cannot be used with the chain whose latest block is at ``block_time_ms``."""
    skew = now_ms - block_time_ms
    if abs(skew) <= MAX_CLOCK_SKEW_MS:
        return None
    way = "behind" if skew < 0 else "ahead of"
    return (f"this machine's clock is {abs(skew) // 1000} s {way} the network's latest block: task and audit "
            "deadlines are in block time, so set the clock right (e.g. 'timedatectl set-ntp true') and run "
            "this again" + ("" if skew < 0 else " (or the network has stalled: ask its operators)"))


def port_problem(listen: str) -> str | None:
    """Why the p2p listen address ``listen`` cannot be bound here (a port another program holds), or None."""
    try:
        host, port = Multiaddr.parse(listen).tcp_endpoint()
    except (MultiaddrError, ValueError):
        return f"the listen address {listen!r} is not a multiaddr like /ip4/0.0.0.0/tcp/4011: fix --listen"
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the node binds: TIME_WAIT is no problem
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"port {port} is used by another program: stop it, or choose another port with "
                        f"--listen /ip4/0.0.0.0/tcp/PORT (and forward that port on your router)")
            return f"cannot listen on {listen}: {exc.strerror}: choose another address with --listen"
    return None


def stake_problem(stake: int, floor: int) -> str | None:
    if stake >= floor:
        return None
    return (f"too little stake: {stake} is below the network's floor of {floor} for a compute node, which would "
            f"never be drawn for a task: bond {floor} or more (dekube-node provide --stake {floor})")


def coverage_problem(params: Params, bonded: int, tasks: list[TaskInfo]) -> str | None:
    """Why ``bonded`` keeps this node from the network's recent tasks (a worker's stake must cover its pay,
    ADR 0188), or None."""
    pays = [worker_share(params, t.price, t.spec_field("workers")) for t in tasks
            if isinstance(t.spec_field("workers"), int) and t.spec_field("workers") > 0]
    if not pays:
        return None
    needed = stake_for_pay(params, max(pays))
    if bonded >= needed:
        return None
    return (f"too little stake for the network's tasks: the largest recent one pays {max(pays)} per worker and "
            f"needs {needed} bonded, this node has {bonded}: bond {needed - bonded} more "
            f"('dekube-node wallet bond {needed - bonded}') or it is drawn only for smaller tasks")


async def problems(ledger: Any, bonded: int, tasks: list[TaskInfo]) -> list[str]:
    """The dashboard's problems of a running compute node: its clock against the latest block, its stake
    against the floor and the recent tasks."""
    block = await ledger.call("dkb_getBlockByNumber", "latest", False)
    answer = await ledger.call("dkb_getParams")
    params = Params(**{f.name: int(answer[f.name]) for f in dataclasses.fields(Params) if f.name in answer})
    found = [clock_problem(int(block["time_ms"]), int(time.time() * 1000)) if block else None,
             stake_problem(bonded, max(params.min_worker_stake, params.min_verifier_stake)),
             coverage_problem(params, bonded, tasks)]
    return [problem for problem in found if problem is not None]

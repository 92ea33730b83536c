"""A worker killed mid-run and replaced (issue 23's ``kill_recovered`` and ``join_s``, docs/adr/0226), on
the product path: a task cut into epochs trained by a crew of 3 of 4 compute nodes; one worker is SIGKILLed
right after its first epoch commitment, the ledger names the fourth node to its seat when that epoch
closes, the joiner fetches a member's committed state, checks it and trains the seat to the end.

Two networks: by default a local devnet (1 validator, 4 compute node processes on loopback TCP, this
machine's cores shared); with ``--netlab`` (as root) the emulated internet of devtools/netlab/task_net.py:
2 validators and 2 relays on public hosts, the 4 compute nodes each behind its own NAT router (one
symmetric), every home's links capped by ``tc tbf`` (``--mbit``, 25) and its WAN link through a delay
line (``--delays-ms``), the crew reaching each other by hole punching or through the relays.

Prints one JSON object: ``kill_recovered`` (the task ended paid, the joiner paid for its epochs, the dead
worker not slashed), ``join_s`` (from the ledger naming the joiner to its first trained step past the
join: it includes waiting for the crew to reach the epoch it enters at), ``catch_up_s`` (from the first
commitment of the state it starts from to that step: fetch, check, load, the crew's gate), the epochs,
payouts and wall time.

    python bench/crew_change.py                       # 6 epochs of 160 data-parallel steps
    python bench/crew_change.py --steps 1920 --segment-steps 160
    sudo python bench/crew_change.py --netlab         # the same over NAT'd 25 Mbit/s homes (480 steps)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consensus.genesis import Params  # noqa: E402
from consensus.state.tasks import task_id_for, worker_share  # noqa: E402
from consensus.tx import build_tx  # noqa: E402
from devtools.devnet import ComputeDevnet  # noqa: E402
from ml.compute.task_spec import submit_payload  # noqa: E402
from ml.profiles import portable_cpu_profile, torch_release  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402
from node.identity import Identity  # noqa: E402
from node.ledger import jsonrpc  # noqa: E402

PRICE = 100_000
FINAL = ("paid", "stopped", "expired", "failed", "rejected")


@dataclass
class Chain:
    """What submitting a task and following it on the ledger need of a network."""
    call: Callable[..., Any]                     # (method, *params) -> a validator's JSON-RPC answer
    faucet: Identity
    chain_id: str
    transport: str                               # how its nodes reach each other, for the JSON


@dataclass
class Crew(Chain):
    """What this bench needs besides: each compute node's own progress, a kill."""
    progress: Callable[[str, str], dict]         # (peer id, task id) -> that node's dkb_taskProgress (raises)
    kill: Callable[[str], None]                  # SIGKILL the node of a peer id
    compute: list[str]                           # the compute nodes' peer ids


def devnet_crew(net: ComputeDevnet) -> Crew:
    """A devnet's compute nodes as a Crew (loopback TCP)."""
    nodes = {n.peer_id: n for n in net.compute}
    return Crew(lambda method, *params: jsonrpc.call(net.rpc_url, method, *params), net.testnet.faucet(),
                net.testnet.chain_id, "tcp on loopback (devnet processes)",
                progress=lambda peer, task_id: jsonrpc.call(nodes[peer].rpc_url, "dkb_taskProgress", task_id),
                kill=lambda peer: net.testnet.kill_node(nodes[peer]), compute=list(nodes))


def netlab_crew(net: Any, mbit: float, delays_ms: list[float]) -> Crew:
    """A devtools.netlab.task_net.TaskNet's compute nodes as a Crew: each behind its NAT, reached from inside."""
    members = {m.peer_id: m for m in net.compute}
    return Crew(net.rpc, net.testnet.faucet(), net.testnet.chain_id,
                f"tcp between NAT'd homes (one symmetric), {mbit:g} Mbit/s tc tbf, one-way delays {delays_ms} ms, "
                f"hole punched or relayed",
                progress=lambda peer, task_id: net.home_rpc(members[peer], "dkb_taskProgress", task_id),
                kill=lambda peer: net.kill(members[peer]), compute=list(members))


def submit(chain: Chain, spec: TrainSpec, epochs: int, expected_s: int, workers: int = 3, **extra) -> str:
    """Submit ``spec`` for ``workers`` at PRICE, cut into ``epochs``, declaring ``expected_s`` of work
    (``extra``: more submit_task fields, e.g. the owner's ``sources``); the task id."""
    payload = {**submit_payload(spec, workers, PRICE, portable_cpu_profile(torch_release())),
               "expected_s": expected_s, "epochs": epochs, **extra}
    nonce = chain.call("dkb_getTransactionCount", chain.faucet.peer_id, "pending")
    tx = build_tx(chain.faucet, chain.chain_id, nonce, "submit_task", payload)
    chain.call("dkb_sendRawTransaction", tx.raw.hex())
    return task_id_for(chain.faucet.peer_id, nonce).hex()


def seat_usage(crew: Crew, worker: str, task_id: str) -> dict:
    """A worker's own account of its seat (dkb_taskProgress): utilization, compute seconds, steps, seconds per
    step over its training span, state; an unreachable worker's error."""
    try:
        job = crew.progress(worker, task_id) or {}
    except Exception as exc:
        return {"error": str(exc)[:200]}
    since, until, step = job.get("training_since"), job.get("training_until"), job.get("step")
    return {**{name: job.get(name) for name in ("utilization", "compute_s", "step", "state")},
            "step_s": round((until - since) / step, 3) if since and until and step else None}


def slot_outcomes(task: dict) -> dict[str, int]:
    """How many of a task's audit slots ended in each outcome."""
    outcomes: dict[str, int] = {}
    for slot in task.get("slots", []):
        outcomes[slot["outcome"]] = outcomes.get(slot["outcome"], 0) + 1
    return outcomes


def wait_for(what: str, condition, timeout: float, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every)
    raise TimeoutError(f"{what} not seen within {timeout:g} s")


def measure(crew: Crew, args) -> dict:
    """Submit the task, kill a worker after its first epoch, time the joiner; the bench's JSON fields."""
    spec = TrainSpec(codec="int8", steps=args.steps, segment_steps=args.segment_steps)
    per_epoch = spec.segment_count // args.epochs

    def task() -> dict:
        return crew.call("dkb_getTask", task_id)

    task_id = submit(crew, spec, args.epochs, args.expected_s)
    workers = wait_for("assignment", lambda: (task() or {}).get("workers"), 120)
    victim = workers[-1]
    spare = next(peer for peer in crew.compute if peer not in workers)
    wait_for("the victim's first epoch", lambda: task()["epochs"].get("commits", {}).get(victim), 300)
    crew.kill(victim)
    killed = time.monotonic()
    joined = wait_for("a joiner", lambda: task()["epochs"].get("joined"), 300)
    named = time.monotonic()
    first = joined[spare][1]

    def state_committed() -> bool:
        commits = task()["epochs"].get("commits", {})
        return any(len(c) >= first for w, c in commits.items() if w in workers and w != victim)
    wait_for("the state the joiner starts from", state_committed, 300)
    state_at = time.monotonic()
    first_step = first * per_epoch * spec.segment_steps

    def joiner_step() -> bool:
        try:
            job = crew.progress(spare, task_id)
        except Exception:
            return False
        return (job or {}).get("step", 0) > first_step
    wait_for("the joiner's first step", joiner_step, 300, every=0.02)
    stepped = time.monotonic()
    final = wait_for("the task's end", lambda: task() if task()["status"] in FINAL else None, 900, every=0.5)
    stake_kept = crew.call("dkb_getStake", victim)["bonded"]
    timings = crew.progress(spare, task_id).get("join_timings")
    share = worker_share(Params(), PRICE, 3)
    joiner_pay = final["payouts"].get(spare, 0)
    recovered = (final["status"] == "paid" and joiner_pay >= share * (args.epochs - first) // args.epochs
                 and victim not in final["payouts"])
    return {"kill_recovered": recovered, "join_s": round(stepped - named, 2),
            "catch_up_s": round(stepped - state_at, 2), "named_after_kill_s": round(named - killed, 2),
            "joiner_timings": timings,
            "epochs": args.epochs, "joined_at_epoch": first + 1, "steps": spec.steps,
            "status": final["status"], "joiner_paid": joiner_pay, "share": share,
            "survivors_paid": {w[:16]: final["payouts"].get(w, 0) for w in workers if w != victim},
            "victim_bonded_after": stake_kept, "transport": crew.transport}


def run(args) -> dict:
    """On a local devnet (loopback TCP)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dkb-crew-") as root:
        net = ComputeDevnet.create(Path(root) / "devnet", validators=1, compute=4,
                                   params={"task_min_s": args.task_min_s, "task_slack_s": 6})
        try:
            net.up(timeout=120)
            return {**measure(devnet_crew(net), args), "bench_seconds": round(time.monotonic() - started, 1)}
        finally:
            net.down(timeout=5)


def run_netlab(args) -> dict:
    """In the netlab: NAT'd homes with shaped, delayed links (see the module doc)."""
    from devtools.netlab.lab import unavailable
    from devtools.netlab.task_net import TaskNet

    why = unavailable()
    if why:
        raise SystemExit(f"the netlab is unavailable here: {why}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dkb-crew-lab-") as root, \
            TaskNet.running(Path(root) / "net", mbit=args.mbit, home_delay_ms=args.delays_ms,
                            params={"task_min_s": args.task_min_s, "task_slack_s": 6}) as net:
        crew = netlab_crew(net, args.mbit, args.delays_ms)
        return {**measure(crew, args), "bench_seconds": round(time.monotonic() - started, 1)}


NETLAB_DEFAULTS = {"steps": 480, "segment_steps": 40, "expected_s": 480, "task_min_s": 60}
# over NAT'd 25 Mbit/s homes a data-parallel step is an all-reduce of a few round trips of 40-100 ms, and the
# crew first finds its paths (hole punching, relays): the declared work, hence each epoch's deadline, must
# cover that, or the first epoch expires before it is trained


def netlab_args(mbit: float, delays_ms: list[float]) -> argparse.Namespace:
    """The netlab run's arguments: its defaults, with these links."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, netlab=True)
    return argparse.Namespace(**vars(parser.parse_args([])), mbit=mbit, delays_ms=delays_ms)


def add_arguments(parser: argparse.ArgumentParser, netlab: bool = False) -> None:
    defaults = {"steps": 960, "segment_steps": 80, "expected_s": 30, "task_min_s": 12,
                **(NETLAB_DEFAULTS if netlab else {})}
    parser.add_argument("--steps", type=int, default=defaults["steps"])
    parser.add_argument("--segment-steps", type=int, default=defaults["segment_steps"])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--expected-s", type=int, default=defaults["expected_s"],
                        help="the declared work (epoch deadlines derive from it)")
    parser.add_argument("--task-min-s", type=int, default=defaults["task_min_s"],
                        help="the network's least commit span")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    netlab = "--netlab" in sys.argv[1:]
    add_arguments(parser, netlab)
    parser.add_argument("--netlab", action="store_true", help="over NAT'd, shaped homes (as root; then the defaults "
                                                              f"are {NETLAB_DEFAULTS})")
    parser.add_argument("--mbit", type=float, default=25.0, help="--netlab: each home's uplink and downlink")
    parser.add_argument("--delays-ms", type=lambda s: [float(x) for x in s.split(",")],
                        default=[20.0, 30.0, 40.0, 50.0], help="--netlab: each home's one-way WAN delay, ms")
    args = parser.parse_args()
    print(json.dumps(run_netlab(args) if args.netlab else run(args)))


if __name__ == "__main__":
    main()

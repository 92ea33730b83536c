"""A worker killed mid-run and replaced (issue 23's ``kill_recovered`` and ``join_s``, docs/adr/0226), on
the product path: a local devnet (1 validator, 4 compute node processes on loopback TCP, this machine's
cores shared), a task cut into epochs trained by a crew of 3; one worker is SIGKILLed right after its
first epoch commitment, the ledger names the fourth node to its seat when that epoch closes, the joiner
fetches a member's committed state, checks it and trains the seat to the end.

Prints one JSON object: ``kill_recovered`` (the task ended paid, the joiner paid for its epochs, the dead
worker not slashed), ``join_s`` (from the ledger naming the joiner to its first trained step past the
join: it includes waiting for the crew to reach the epoch it enters at), ``catch_up_s`` (from the first
commitment of the state it starts from to that step: fetch, check, load, the crew's gate), the epochs,
payouts and wall time.

    python bench/crew_change.py                       # 6 epochs of 160 data-parallel steps
    python bench/crew_change.py --steps 1920 --segment-steps 160
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consensus.genesis import Params  # noqa: E402
from consensus.state.tasks import task_id_for, worker_share  # noqa: E402
from consensus.tx import build_tx  # noqa: E402
from devtools.devnet import ComputeDevnet  # noqa: E402
from ml.compute.task_spec import submit_payload  # noqa: E402
from ml.profiles import portable_cpu_profile, torch_release  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402
from node.ledger import jsonrpc  # noqa: E402

PRICE = 100_000
FINAL = ("paid", "stopped", "expired", "failed", "rejected")


def submit(net: ComputeDevnet, spec: TrainSpec, epochs: int, expected_s: int) -> str:
    payload = {**submit_payload(spec, 3, PRICE, portable_cpu_profile(torch_release())), "expected_s": expected_s,
               "epochs": epochs}
    faucet = net.testnet.faucet()
    nonce = jsonrpc.call(net.rpc_url, "dkb_getTransactionCount", faucet.peer_id, "pending")
    tx = build_tx(faucet, net.testnet.chain_id, nonce, "submit_task", payload)
    jsonrpc.call(net.rpc_url, "dkb_sendRawTransaction", tx.raw.hex())
    return task_id_for(faucet.peer_id, nonce).hex()


def wait_for(what: str, condition, timeout: float, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every)
    raise TimeoutError(f"{what} not seen within {timeout:g} s")


def run(args) -> dict:
    spec = TrainSpec(codec="int8", steps=args.steps, segment_steps=args.segment_steps)
    per_epoch = spec.segment_count // args.epochs
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dkb-crew-") as root:
        net = ComputeDevnet.create(Path(root) / "devnet", validators=1, compute=4,
                                   params={"task_min_s": args.task_min_s, "task_slack_s": 6})
        try:
            net.up(timeout=120)

            def task() -> dict:
                return jsonrpc.call(net.rpc_url, "dkb_getTask", task_id)

            task_id = submit(net, spec, args.epochs, args.expected_s)
            workers = wait_for("assignment", lambda: (task() or {}).get("workers"), 120)
            victim = next(n for n in net.compute if n.peer_id == workers[-1])
            spare = next(n for n in net.compute if n.peer_id not in workers)
            wait_for("the victim's first epoch", lambda: task()["epochs"].get("commits", {}).get(victim.peer_id), 300)
            net.testnet.kill_node(victim)
            killed = time.monotonic()
            joined = wait_for("a joiner", lambda: task()["epochs"].get("joined"), 300)
            named = time.monotonic()
            first = joined[spare.peer_id][1]

            def state_committed() -> bool:
                commits = task()["epochs"].get("commits", {})
                return any(len(c) >= first for w, c in commits.items() if w in workers and w != victim.peer_id)
            wait_for("the state the joiner starts from", state_committed, 300)
            state_at = time.monotonic()
            first_step = first * per_epoch * spec.segment_steps

            def joiner_step() -> bool:
                try:
                    job = jsonrpc.call(spare.rpc_url, "dkb_taskProgress", task_id)
                except Exception:
                    return False
                return job.get("step", 0) > first_step
            wait_for("the joiner's first step", joiner_step, 300, every=0.02)
            stepped = time.monotonic()
            final = wait_for("the task's end", lambda: task() if task()["status"] in FINAL else None, 600, every=0.5)
            stake_kept = jsonrpc.call(net.rpc_url, "dkb_getStake", victim.peer_id)["bonded"]
            timings = jsonrpc.call(spare.rpc_url, "dkb_taskProgress", task_id).get("join_timings")
            share = worker_share(Params(), PRICE, 3)
            joiner_pay = final["payouts"].get(spare.peer_id, 0)
            recovered = (final["status"] == "paid" and joiner_pay >= share * (args.epochs - first) // args.epochs
                         and victim.peer_id not in final["payouts"])
            return {"kill_recovered": recovered, "join_s": round(stepped - named, 2),
                    "catch_up_s": round(stepped - state_at, 2), "named_after_kill_s": round(named - killed, 2),
                    "joiner_timings": timings,
                    "epochs": args.epochs, "joined_at_epoch": first + 1, "steps": spec.steps,
                    "status": final["status"], "joiner_paid": joiner_pay, "share": share,
                    "survivors_paid": {w[:16]: final["payouts"].get(w, 0) for w in workers if w != victim.peer_id},
                    "victim_bonded_after": stake_kept, "transport": "tcp on loopback (devnet processes)",
                    "bench_seconds": round(time.monotonic() - started, 1)}
        finally:
            net.down(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=960)
    parser.add_argument("--segment-steps", type=int, default=80)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--expected-s", type=int, default=30, help="the declared work (epoch deadlines derive from it)")
    parser.add_argument("--task-min-s", type=int, default=12, help="the devnet's least commit span")
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()

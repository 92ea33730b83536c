"""The main job across NAT: ``python -m devtools.netlab.demo_nat`` (root; iproute2, nftables, tc).

Builds the emulated internet of task_net.py (validators and two relays on public hosts, four
compute nodes each behind its own NAT router, one of them symmetric), submits the user's own model
(examples/digits_cnn.py: a CNN exported to model.pt2, with train.npz/test.npz, served from the
submitting host; ``--registry`` submits the registry's digits MLP instead) for 3 workers (int8
all-reduce), follows it until it is trained, committed, audited (ledger-drawn slots, replayed) and paid, fetches the
trained weights and evaluates them (accuracy before and after), prints what the ledger and the
relays saw, and tears everything down. Exit status 0 only if the task was paid (and its weights
fetched) and the supply is conserved.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from consensus.state.relay_bytes import by_relay as by_relay_of
from devtools.testnet import REPO_ROOT

from .lab import unavailable
from .task_net import TaskNet

EXAMPLE = REPO_ROOT / "examples" / "digits_cnn.py"


def example(*argv: str) -> dict:
    """Runs the example (outside the lab: it only reads and writes files); its last line as JSON."""
    done = subprocess.run([sys.executable, str(EXAMPLE), *argv], capture_output=True, text=True, check=True,
                          cwd=str(REPO_ROOT), timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def task_arguments(args: argparse.Namespace, job: Path) -> list[str]:
    if args.registry:
        return ["--model", "mlp", "--dataset", "digits"]
    return ["--model", str(job / "model.pt2"), "--dataset", str(job / "train.npz"), "--eval", str(job / "test.npz"),
            "--loss", "cross_entropy", "--lr", "3e-3", "--batch", "64", "--out", str(job / "trained")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--price", type=int, default=100_000)
    parser.add_argument("--registry", action="store_true", help="submit the registry's digits MLP, no files")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"the NAT demo cannot run here: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dekube-nat-demo-") as root:
        net = TaskNet.build(Path(root) / "net")
        try:
            print("== emulated internet: validators on 10.99.0.10, relays on .11 and .12, "
                  "compute nodes in homes behind NAT (home 3: symmetric NAT)", flush=True)
            net.up()
            for member, home in zip(net.compute, net.lab.homes):
                info = net.rpc("dkb_getNode", member.peer_id)
                print(f"  {member.name} {member.peer_id[:16]}.. home {home.index} ({home.nat} NAT) "
                      f"listens {info['listen_addrs'][0].split('/p2p/')[0]}, reachable via "
                      f"{len(info['relay_addrs'])} relays", flush=True)
            job = Path(root) / "user-job"
            if args.registry:
                what = "mlp on digits (registry)"
            else:
                example("prepare", str(job))
                before = example("evaluate", str(job), "--json")
                what = f"your CNN (model.pt2, train.npz; untrained accuracy {before['accuracy']:.2f}%)"
            print(f"== submitting a task: {what}, 3 workers, int8, {args.steps} steps, price {args.price}",
                  flush=True)
            out = net.cli("task", "submit", "--rpc", net.testnet.nodes[0].rpc_url,
                          "--key", str(net.testnet.faucet_key), *task_arguments(args, job),
                          "--workers", "3", "--codec", "int8", "--steps", str(args.steps),
                          "--price", str(args.price), "--wait", "--timeout", "600", "--json")
            task = json.loads(out.strip().splitlines()[-1])
            names = {m.peer_id: m.name for m in net.compute}
            print(f"== task {task['task_id'][:16]}.. {task['status']}")
            for slot in task["slots"]:   # the ledger-drawn audit slots (docs/adr/0168)
                answers = ", ".join(
                    f"{names.get(v['verifier'])} " + ("silent" if v["answer"] is None
                                                      else "match" if v["answer"]["match"] else "MISMATCH")
                    for v in slot["verifiers"])
                votes = "".join(f", referee {names.get(r['referee'])} "
                                + ("silent" if r["vote"] is None else "match" if r["vote"]["match"] else "MISMATCH")
                                for r in slot["referees"])
                print(f"  slot {slot['slot']}: segment {slot['segment']} of {names.get(slot['worker'])} "
                      f"replayed by {answers or 'nobody'}{votes}: {slot['outcome']}")
            for peer, amount in sorted(task["payouts"].items(), key=lambda kv: -kv[1]):
                print(f"  paid {amount:>7} to {names.get(peer, 'the owner (refund)')}")
            fetched = task.get("fetched")
            if not args.registry:
                if not fetched:
                    print("== the trained weights were not fetched")
                    return 1
                after = example("evaluate", str(job), "--weights", fetched["weights"], "--json")
                print(f"== weights {fetched['result'][:16]}.. fetched from the NAT'd workers and checked against the "
                      f"ledger: accuracy before {before['accuracy']:.2f}%, after {after['accuracy']:.2f}% "
                      f"(workers reported {fetched['final_metrics']})")
                # a later, separate command: a new client node reaches the NAT'd workers through the relays
                again = json.loads(net.cli("task", "fetch", task["task_id"], "--out", str(job / "refetch"),
                                           "--rpc", net.testnet.nodes[0].rpc_url, "--key",
                                           str(net.testnet.faucet_key), "--json").strip().splitlines()[-1])
                same = again["result"] == fetched["result"]
                print(f"== a later `task fetch` (a new client node, through the relays): weights "
                      f"{again['result'][:16]}.. {'identical' if same else 'DIFFERENT'}")
                if not same:
                    return 1
            relayed = {r.name: int(net.metric(r, "dekube_relay_bytes_total")) for r in net.relays}
            print("== relays carried " + ", ".join(f"{n}: {b / 1e6:.2f} MB" for n, b in relayed.items()))
            names.update({r.peer_id: r.name for r in net.relays})
            by_relay = by_relay_of(task.get("relay_bytes") or {})   # the workers' counts at commit (ADR 0223)
            print("== of which the task's all-reduce circuits (the workers' counts at commit): "
                  + (", ".join(f"{names.get(r, r[:16])}: {b / 1e6:.2f} MB" for r, b in by_relay.items()) or "none"))
            supply = net.rpc("dkb_getSupply")
            conserved = supply["total"] == supply["genesis"]
            print(f"== supply {supply['total']} ({'conserved' if conserved else 'NOT CONSERVED'}); "
                  f"{time.monotonic() - started:.0f} s in all")
            return 0 if task["status"] == "paid" and conserved else 1
        finally:
            net.close()


if __name__ == "__main__":
    sys.exit(main())

"""The main job across NAT: ``python -m tests.netlab.demo_nat`` (root; iproute2, nftables, tc).

Builds the emulated internet of task_net.py (validators and two relays on public hosts, four
compute nodes each behind its own NAT router, one of them symmetric), submits a paid digits task
for 3 workers (int8 all-reduce), follows it until it is trained, committed, audited by replay and
paid, prints what the ledger and the relays saw, and tears everything down. Exit status 0 only if
the task was paid and the supply is conserved.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from .lab import unavailable
from .task_net import TaskNet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--price", type=int, default=100_000)
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
            print(f"== submitting a task: mlp on digits, 3 workers, int8, {args.steps} steps, price {args.price}",
                  flush=True)
            task = json.loads(net.cli("task", "submit", "--rpc", net.testnet.nodes[0].rpc_url,
                                      "--key", str(net.testnet.faucet_key), "--model", "mlp", "--dataset", "digits",
                                      "--workers", "3", "--codec", "int8", "--steps", str(args.steps),
                                      "--price", str(args.price), "--wait", "--timeout", "600", "--json"))
            names = {m.peer_id: m.name for m in net.compute}
            print(f"== task {task['task_id'][:16]}.. {task['status']}")
            for verifier, worker, segment, match, height in task["audits"]:
                print(f"  {names.get(verifier)} replayed segment {segment} of {names.get(worker)}: "
                      f"{'match' if match else 'MISMATCH'} (height {height})")
            for peer, amount in sorted(task["payouts"].items(), key=lambda kv: -kv[1]):
                print(f"  paid {amount:>7} to {names.get(peer, 'the owner (refund)')}")
            relayed = {r.name: int(net.metric(r, "dekube_relay_bytes_total")) for r in net.relays}
            print("== relays carried " + ", ".join(f"{n}: {b / 1e6:.2f} MB" for n, b in relayed.items()))
            supply = net.rpc("dkb_getSupply")
            conserved = supply["total"] == supply["genesis"]
            print(f"== supply {supply['total']} ({'conserved' if conserved else 'NOT CONSERVED'}); "
                  f"{time.monotonic() - started:.0f} s in all")
            return 0 if task["status"] == "paid" and conserved else 1
        finally:
            net.close()


if __name__ == "__main__":
    sys.exit(main())

"""Soak: kill -9 (and now and then SIGSTOP) random validators of a local testnet under wallet load,
restart them, and check every chain invariant over RPC at the end (and every ``--check-every`` kills).

    python scripts/soak.py --kills 1000 [--validators 4] [--rate 20] [--home DIR] [--seed 1]

One fault at a time (4 validators tolerate one): after each, the victim must answer RPC and catch up
with the others within ``--recover-timeout`` before the next one (a violation otherwise). The last line printed
is a JSON object: kills, stops, confirmed transactions, final heights, violations (must be []).
Exit status 1 when an invariant is violated or the chain stops making progress.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devtools.chaincheck import check_chain  # noqa: E402
from devtools.loadgen import WalletLoad  # noqa: E402
from devtools.testnet import Testnet, TestnetError  # noqa: E402
from node.identity import Identity  # noqa: E402


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def check(testnet: Testnet, load: WalletLoad, stop_load: threading.Event, loader: threading.Thread) -> list[str]:
    stop_load.set()
    loader.join(15)
    if not load.drain(60):
        return [f"{len(load.in_flight)} transactions never got a receipt"]
    top = max(testnet.height(n) or 0 for n in testnet.nodes)
    testnet.wait_height(top, timeout=60)
    violations = check_chain([n.rpc_url for n in testnet.nodes], testnet.genesis(), load.confirmed)
    violations += [f"tx {h} failed: {status}" for h, status in load.failed.items()]
    return violations


def recovered(testnet: Testnet, victim, timeout: float) -> str | None:
    """Wait until ``victim`` answers and has caught up with the others; a violation text if not."""
    deadline = time.monotonic() + timeout
    target = max(testnet.height(n) or 0 for n in testnet.nodes if n is not victim)
    while time.monotonic() < deadline:
        height = testnet.height(victim)
        if height is not None and height >= target:
            return None
        if not testnet.is_running(victim):
            return f"{victim.name} exited; see {victim.log_file}"
        time.sleep(0.2)
    return f"{victim.name} did not catch up to height {target} within {timeout:g} s (at {testnet.height(victim)})"


def soak(args, testnet: Testnet, accounts: list[Identity]) -> dict:
    rng = random.Random(args.seed)
    testnet.up(wait_height=2, timeout=120)
    urls = [n.rpc_url for n in testnet.nodes]
    load = WalletLoad(urls, testnet.chain_id, accounts, [a.peer_id for a in accounts], rate=args.rate, seed=args.seed)
    kills = stops = 0
    violations: list[str] = []
    started = time.monotonic()
    while kills < args.kills and not violations:
        stop_load = threading.Event()
        loader = threading.Thread(target=load.run, args=(stop_load,), daemon=True)
        loader.start()
        for _ in range(min(args.check_every, args.kills - kills)):
            victim = rng.choice(testnet.nodes)
            if rng.random() < args.stop_fraction:
                testnet.signal_node(victim, signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 3.0))
                testnet.signal_node(victim, signal.SIGCONT)
                stops += 1
            else:
                time.sleep(rng.uniform(0.0, 1.5))     # kill at a random instant of its work
                testnet.kill_node(victim)
                time.sleep(rng.uniform(0.0, 1.0))
                testnet.start_node(victim)
                kills += 1
            failure = recovered(testnet, victim, args.recover_timeout)  # one fault at a time
            if failure:
                violations.append(failure)
                break
            if kills % 10 == 0:
                log(f"{kills} kills, {stops} stops, {len(load.confirmed)} confirmed, "
                    f"heights {[testnet.height(n) for n in testnet.nodes]}")
        violations += check(testnet, load, stop_load, loader)
        log(f"checked after {kills} kills: {len(violations)} violations")
    return {"kills": kills, "stops": stops, "confirmed": len(load.confirmed), "submitted": load.submitted,
            "resubmitted": load.errors.get("resubmitted", 0), "seconds": round(time.monotonic() - started, 1),
            "final_heights": [testnet.height(n) for n in testnet.nodes], "violations": violations[:50]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--validators", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="wallet transactions per second")
    parser.add_argument("--accounts", type=int, default=60)
    parser.add_argument("--check-every", type=int, default=50, help="kills between invariant checks")
    parser.add_argument("--stop-fraction", type=float, default=0.2, help="share of faults that are SIGSTOP")
    parser.add_argument("--recover-timeout", type=float, default=60.0,
                        help="seconds a restarted or resumed validator has to catch up before the next fault")
    parser.add_argument("--log-level", default="warning", help="validators' log level")
    parser.add_argument("--home", help="testnet directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    accounts = [Identity.from_seed((7 * 10**6 + i).to_bytes(32, "big")) for i in range(args.accounts)]
    with tempfile.TemporaryDirectory(prefix="dekube-soak-") as tmp:
        testnet = Testnet.create(args.home or tmp, args.validators, chain_id="dekube-soak",
                                 balances={a.peer_id: 10**12 for a in accounts},
                                 settings={"node.log_level": args.log_level})
        try:
            result = soak(args, testnet, accounts)
        except TestnetError as exc:
            result = {"violations": [f"testnet failed: {exc}"]}
        finally:
            for node in testnet.nodes:
                testnet.kill_node(node)
    print(json.dumps(result))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""A task of half an hour of compute, trained, audited and paid (issue 23's ``long_task_paid``): a local
devnet (1 validator, 3 compute node processes on loopback TCP, sharing this machine's cores), the digits
MLP trained data-parallel int8 for ``--steps`` steps, cut into epochs of a few minutes (each with its own
deadline in block time, ADRs 0187 and 0203), its declared work ``--expected-s``.

Prints one JSON object: ``long_task_paid`` (the task ended paid and its training took at least
``--min-training-s``), ``training_s`` (from assignment until every worker's result was on the ledger),
the epochs closed, the audit slots' outcomes, the payouts and the wall time.

    python bench/long_task.py                                  # 72,000 steps: about 35 min here
    python bench/long_task.py --steps 6000 --min-training-s 60 # a short check of the same path
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.crew_change import FINAL, PRICE, submit, wait_for  # noqa: E402
from devtools.devnet import ComputeDevnet  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402
from node.ledger import jsonrpc  # noqa: E402


def run(args) -> dict:
    spec = TrainSpec(codec="int8", steps=args.steps, segment_steps=args.segment_steps)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dkb-long-") as root:
        net = ComputeDevnet.create(Path(root) / "devnet", validators=1, compute=3)
        try:
            net.up(timeout=120)

            def task() -> dict:
                return jsonrpc.call(net.rpc_url, "dkb_getTask", task_id) or {}

            task_id = submit(net, spec, args.epochs, args.expected_s)
            wait_for("assignment", lambda: task().get("workers"), 120)
            assigned = time.monotonic()
            wait_for("every result", lambda: len(task().get("commits", {})) == 3 or task().get("status") in FINAL,
                     args.expected_s * 4 + 600, every=2.0)
            trained = time.monotonic()
            final = wait_for("the task's end", lambda: task() if task().get("status") in FINAL else None, 1800,
                             every=2.0)
            training_s = trained - assigned
            outcomes: dict[str, int] = {}
            for slot in final.get("slots", []):
                outcomes[slot["outcome"]] = outcomes.get(slot["outcome"], 0) + 1
            return {"long_task_paid": final["status"] == "paid" and training_s >= args.min_training_s,
                    "status": final["status"], "training_s": round(training_s, 1), "steps": spec.steps,
                    "segments": spec.segment_count, "epochs": args.epochs,
                    "epochs_closed": final.get("epochs", {}).get("current"), "expected_s": args.expected_s,
                    "slots": outcomes, "payouts": final.get("payouts"), "price": PRICE,
                    "transport": "tcp on loopback (devnet processes)",
                    "bench_seconds": round(time.monotonic() - started, 1)}
        finally:
            net.down(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=72_000)
    parser.add_argument("--segment-steps", type=int, default=1_200)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--expected-s", type=int, default=2_400, help="the declared work")
    parser.add_argument("--min-training-s", type=float, default=1_800.0, help="what counts as a long task")
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()

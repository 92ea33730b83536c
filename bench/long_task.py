"""A task of half an hour of compute, trained, audited and paid (issue 23's ``long_task_paid``): a local
devnet (1 validator, 3 compute node processes on loopback TCP, sharing this machine's cores), the digits
MLP trained data-parallel int8 for ``--steps`` steps, cut into epochs of a few minutes (each with its own
deadline in block time, ADRs 0187 and 0203), its declared work ``--expected-s``.

Prints one JSON object: ``long_task_paid`` (the task ended paid and its training took at least
``--min-training-s``), ``training_s`` (from assignment until every worker's result was on the ledger),
the epochs closed, the audit slots' outcomes, the payouts and the wall time.

With ``--netlab`` (as root) the same over the emulated internet of devtools/netlab/task_net.py: 2
validators and 2 relays on public hosts, the 3 compute nodes each behind its own NAT router (one
symmetric), every home's links capped by ``tc tbf`` (``--mbit``, 25) and its WAN link through a delay line
(``--delays-ms``); and with ``--recipe`` the task trains that recipe of ml/train/recipes.py (e.g.
``shakespeare-streaming``: the char transformer, streaming DiLoCo int4) with ``--inner-steps``,
``--fragments``, ``--overlap``, ``--lr``, ``--outer-lr``, ``--outer-momentum`` over it.

    python bench/long_task.py                                  # 72,000 steps: about 35 min here
    python bench/long_task.py --steps 6000 --min-training-s 60 # a short check of the same path
    sudo python bench/long_task.py --netlab --recipe shakespeare-streaming --steps 24000 --inner-steps 100 \
        --fragments 4 --overlap 10 --lr 0.016 --outer-lr 1.0 --outer-momentum 0.5 --epochs 12 --expected-s 2400
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.crew_change import FINAL, PRICE, Chain, submit, wait_for  # noqa: E402
from devtools.devnet import ComputeDevnet  # noqa: E402
from ml.train.recipes import RECIPES, recipe  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402
from node.ledger import jsonrpc  # noqa: E402


def task_spec(args) -> TrainSpec:
    """The task's spec: the digits MLP data-parallel int8, or ``--recipe`` with the outer flags over it."""
    if not args.recipe:
        return TrainSpec(codec="int8", steps=args.steps, segment_steps=args.segment_steps)
    overrides = {name: value for name, value in (("inner_steps", args.inner_steps), ("fragments", args.fragments),
                                                 ("overlap_steps", args.overlap), ("lr", args.lr),
                                                 ("outer_lr", args.outer_lr), ("outer_momentum", args.outer_momentum))
                 if value is not None}
    return recipe(args.recipe, steps=args.steps, segment_steps=args.segment_steps, warmup_steps=args.warmup,
                  report_every=100, **overrides)


def measure(chain: Chain, args) -> dict:
    """Submit the task, wait for its results and its end; the bench's JSON fields."""
    spec = task_spec(args)

    def task() -> dict:
        return chain.call("dkb_getTask", task_id) or {}

    task_id = submit(chain, spec, args.epochs, args.expected_s)
    wait_for("assignment", lambda: task().get("workers"), 120)
    assigned = time.monotonic()
    wait_for("every result", lambda: len(task().get("commits", {})) == 3 or task().get("status") in FINAL,
             args.expected_s * 4 + 600, every=2.0)
    trained = time.monotonic()
    final = wait_for("the task's end", lambda: task() if task().get("status") in FINAL else None, 1800, every=2.0)
    training_s = trained - assigned
    outcomes: dict[str, int] = {}
    for slot in final.get("slots", []):
        outcomes[slot["outcome"]] = outcomes.get(slot["outcome"], 0) + 1
    return {"long_task_paid": final["status"] == "paid" and training_s >= args.min_training_s,
            "status": final["status"], "training_s": round(training_s, 1), "steps": spec.steps, "mode": spec.mode,
            "model": spec.model, "codec": spec.codec, "segments": spec.segment_count, "epochs": args.epochs,
            "epochs_closed": final.get("epochs", {}).get("current"), "expected_s": args.expected_s,
            "slots": outcomes, "payouts": final.get("payouts"), "price": PRICE, "transport": chain.transport}


def run(args) -> dict:
    """On a local devnet (loopback TCP)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dkb-long-") as root:
        net = ComputeDevnet.create(Path(root) / "devnet", validators=1, compute=3)
        try:
            net.up(timeout=120)
            chain = Chain(lambda method, *params: jsonrpc.call(net.rpc_url, method, *params), net.testnet.faucet(),
                          net.testnet.chain_id, "tcp on loopback (devnet processes)")
            return {**measure(chain, args), "bench_seconds": round(time.monotonic() - started, 1)}
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
    delays = args.delays_ms[:3]
    with tempfile.TemporaryDirectory(prefix="dkb-long-lab-") as root, \
            TaskNet.running(Path(root) / "net", compute=3, mbit=args.mbit, home_delay_ms=delays) as net:
        chain = Chain(net.rpc, net.testnet.faucet(), net.testnet.chain_id,
                      f"tcp between NAT'd homes (one symmetric), {args.mbit:g} Mbit/s tc tbf, one-way delays "
                      f"{delays} ms, hole punched or relayed")
        return {**measure(chain, args), "bench_seconds": round(time.monotonic() - started, 1)}


NETLAB_DEFAULTS = {"recipe": "shakespeare-streaming", "steps": 24_000, "inner_steps": 100, "fragments": 4,
                   "overlap": 10, "lr": 0.016, "outer_lr": 1.0, "outer_momentum": 0.5, "epochs": 12}
# the char transformer in streaming DiLoCo int4 with the settings of issue 23's netlab runs (docs/BENCHMARKS.md):
# about 0.09 s a step for a crew of 3 NAT'd homes on this 2-core machine, so 24,000 steps are ~36 min


def netlab_args(mbit: float, delays_ms: list[float]) -> argparse.Namespace:
    """The netlab run's arguments (bench/training_netlab.py --long-task): NETLAB_DEFAULTS, these links."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.set_defaults(**NETLAB_DEFAULTS)
    return argparse.Namespace(**vars(parser.parse_args([])), mbit=mbit, delays_ms=delays_ms)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=72_000)
    parser.add_argument("--segment-steps", type=int, default=1_200, help="data-parallel steps per segment")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--expected-s", type=int, default=2_400, help="the declared work")
    parser.add_argument("--min-training-s", type=float, default=1_800.0, help="what counts as a long task")
    parser.add_argument("--recipe", choices=sorted(RECIPES), help="train this recipe instead of the digits MLP "
                                                                  "data-parallel int8")
    parser.add_argument("--warmup", type=int, default=0, help="--recipe: its warmup steps")
    for flag, kind in (("--inner-steps", int), ("--fragments", int), ("--overlap", int), ("--lr", float),
                       ("--outer-lr", float), ("--outer-momentum", float)):
        parser.add_argument(flag, type=kind, help="--recipe: over the recipe's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--netlab", action="store_true", help="over NAT'd, shaped homes (as root)")
    parser.add_argument("--mbit", type=float, default=25.0, help="--netlab: each home's uplink and downlink")
    parser.add_argument("--delays-ms", type=lambda s: [float(x) for x in s.split(",")], default=[20.0, 30.0, 40.0],
                        help="--netlab: each home's one-way WAN delay, ms")
    args = parser.parse_args()
    print(json.dumps(run_netlab(args) if args.netlab else run(args)))


if __name__ == "__main__":
    main()

"""A task of half an hour of compute, trained, audited and paid (issue 23's ``long_task_paid``): a local
devnet (1 validator, 3 compute node processes on loopback TCP, sharing this machine's cores), the digits
MLP trained data-parallel int8 for ``--steps`` steps, cut into epochs of a few minutes (each with its own
deadline in block time, ADRs 0187 and 0203), its declared work ``--expected-s``.

Prints one JSON object: ``long_task_paid`` (the task ended paid and its training took at least
``--min-training-s``), ``training_s`` (from assignment until every worker's result was on the ledger),
the epochs closed, the audit slots' outcomes, the payouts, ``utilization`` (the least of the workers' own
figures, dkb_taskProgress: compute time over the time their seat trained, epoch boundaries included),
``fetched`` (the owner's ``task fetch`` got the weights the ledger names) and the wall time.

With ``--kill-after N`` a fourth compute node stands by: a worker is SIGKILLed once it committed N epochs,
the ledger names the spare to its seat, and the JSON adds ``join_s`` (from naming to the joiner's first
step), each one's wages against the epochs it trained and ``paid_per_contribution``.

With ``--netlab`` (as root) the same over the emulated internet of devtools/netlab/task_net.py: 2
validators and 2 relays on public hosts, the 3 compute nodes each behind its own NAT router (one
symmetric), every home's links capped by ``tc tbf`` (``--mbit``, 25) and its WAN link through a delay line
(``--delays-ms``); and with ``--recipe`` the task trains that recipe of ml/train/recipes.py (e.g.
``shakespeare-streaming``: the char transformer, streaming DiLoCo int4) with ``--inner-steps``,
``--fragments``, ``--overlap``, ``--lr``, ``--outer-lr``, ``--outer-momentum`` over it.

    python bench/long_task.py                                  # 72,000 steps: about 35 min here
    python bench/long_task.py --steps 6000 --min-training-s 60 # a short check of the same path
    python bench/long_task.py --steps 4800 --segment-steps 200 --epochs 6 --expected-s 120 --min-training-s 1 \
        --kill-after 2                                         # the same with a worker killed and replaced
    sudo python bench/long_task.py --netlab --recipe shakespeare-streaming --steps 24000 --inner-steps 100 \
        --fragments 4 --overlap 10 --lr 0.016 --outer-lr 1.0 --outer-momentum 0.5 --epochs 12 --expected-s 2400
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.crew_change import FINAL, PRICE, Crew, devnet_crew, netlab_crew, seat_usage, slot_outcomes, submit, wait_for  # noqa: E402
from consensus.genesis import Params  # noqa: E402
from consensus.state.tasks import worker_share  # noqa: E402
from devtools.devnet import ComputeDevnet  # noqa: E402
from ml.train.recipes import RECIPES, recipe  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402


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


def measure(crew: Crew, args, fetch: Callable[[str, Path], dict]) -> dict:
    """Submit the task; with ``--kill-after`` SIGKILL a worker after that many epoch commitments and time
    the spare that the ledger names to its seat; wait for the results and the end; fetch the weights
    (``fetch(task_id, out_dir)``: ``task fetch --json``'s answer); the bench's JSON fields."""
    spec = task_spec(args)

    def task() -> dict:
        return crew.call("dkb_getTask", task_id) or {}

    task_id = submit(crew, spec, args.epochs, args.expected_s)
    workers = wait_for("assignment", lambda: task().get("workers"), 120)
    assigned = time.monotonic()
    churn = kill_and_replace(crew, task, task_id, workers, args) if args.kill_after else {}
    victim = churn.get("victim")
    wait_for("every result", lambda: len(task().get("commits", {})) == 3 or task().get("status") in FINAL,
             args.expected_s * 4 + 600, every=2.0)
    trained = time.monotonic()
    seats = [w for w in workers if w != victim] + ([churn["joiner"]] if churn else [])
    usage = {w[:16]: seat_usage(crew, w, task_id) for w in seats}
    final = wait_for("the task's end", lambda: task() if task().get("status") in FINAL else None, 1800, every=2.0)
    training_s = trained - assigned
    with tempfile.TemporaryDirectory(prefix="dkb-long-fetch-") as folder:
        started = time.monotonic()
        fetched = fetch(task_id, Path(folder)) if final["status"] == "paid" else {}
        fetch_s = time.monotonic() - started
    figures = [u["utilization"] for u in usage.values() if u.get("utilization") is not None]
    paid = final["status"] == "paid" and training_s >= args.min_training_s
    out = {"long_task_paid": paid, "status": final["status"], "training_s": round(training_s, 1),
           "steps": spec.steps, "mode": spec.mode, "model": spec.model, "codec": spec.codec,
           "segments": spec.segment_count, "epochs": args.epochs,
           "epochs_closed": final.get("epochs", {}).get("current"), "expected_s": args.expected_s,
           "slots": slot_outcomes(final), "payouts": final.get("payouts"), "price": PRICE,
           "utilization": min(figures) if figures else None, "workers_usage": usage,
           "fetched": bool(fetched) and fetched.get("result") == final.get("result"),
           "fetch_s": round(fetch_s, 1), "final_metrics": fetched.get("final_metrics"),
           "transport": crew.transport}
    if churn:
        out.update(churn_figures(final, churn, args.epochs))
    return out


def kill_and_replace(crew: Crew, task: Callable[[], dict], task_id: str, workers: list[str], args) -> dict:
    """SIGKILL the last worker once it committed ``--kill-after`` epochs; wait for the ledger to name the
    spare to its seat and for the joiner's first trained step past its epoch boundary."""
    victim = workers[-1]
    spare = next(peer for peer in crew.compute if peer not in workers)
    wait_for(f"the victim's epoch {args.kill_after}",
             lambda: len(task().get("epochs", {}).get("commits", {}).get(victim, [])) >= args.kill_after,
             args.expected_s * 4, every=2.0)
    crew.kill(victim)
    killed = time.monotonic()
    joined = wait_for("a joiner", lambda: task().get("epochs", {}).get("joined"), args.expected_s * 2, every=1.0)
    named = time.monotonic()
    first = joined[spare][1]
    first_step = first * (task_spec(args).steps // args.epochs)

    def joiner_step() -> bool:
        try:
            return (crew.progress(spare, task_id) or {}).get("step", 0) > first_step
        except Exception:
            return False
    wait_for("the joiner's first step", joiner_step, args.expected_s, every=0.5)
    return {"victim": victim, "joiner": spare, "killed_after_epochs": args.kill_after, "joined_at_epoch": first,
            "named_after_kill_s": round(named - killed, 1), "join_s": round(time.monotonic() - named, 1)}


def churn_figures(final: dict, churn: dict, epochs: int) -> dict:
    """Pay per contribution: every worker's wages (the ledger's ``epochs.earned``) against the epochs it
    trained. The victim earns at most the epochs it committed, the joiner at least the epochs from its
    seat on (each audited ``ok``), a survivor its whole share."""
    earned = final.get("epochs", {}).get("earned", {})
    share = worker_share(Params(), PRICE, 3)
    victim, joiner = churn["victim"], churn["joiner"]
    survivors = [w for w in final["workers"] if w not in (victim, joiner)]
    by_epochs = {"victim": (earned.get(victim, 0), share * churn["killed_after_epochs"] // epochs),
                 "joiner": (earned.get(joiner, 0), share * (epochs - churn["joined_at_epoch"]) // epochs)}
    fair = (0 < by_epochs["victim"][0] <= by_epochs["victim"][1] + epochs
            and by_epochs["joiner"][0] >= by_epochs["joiner"][1]
            and all(earned.get(w, 0) >= share - epochs for w in survivors))
    return {**{k: v for k, v in churn.items() if k not in ("victim", "joiner")}, "share": share,
            "victim_earned": by_epochs["victim"][0], "victim_epochs_bound": by_epochs["victim"][1],
            "joiner_earned": by_epochs["joiner"][0], "joiner_epochs_floor": by_epochs["joiner"][1],
            "survivors_earned": [earned.get(w, 0) for w in survivors], "paid_per_contribution": fair}


def run(args) -> dict:
    """On a local devnet (loopback TCP)."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dkb-long-") as root:
        net = ComputeDevnet.create(Path(root) / "devnet", validators=1, compute=4 if args.kill_after else 3)
        try:
            net.up(timeout=120)

            def fetch(task_id: str, out: Path) -> dict:
                done = subprocess.run([sys.executable, "-m", "cli.main", "task", "fetch", task_id, "--out", str(out),
                                       "--rpc", net.rpc_url, "--key", str(net.testnet.faucet_key), "--json"],
                                      capture_output=True, text=True, timeout=600, check=True, cwd=REPO)
                return json.loads(done.stdout)
            return {**measure(devnet_crew(net), args, fetch), "bench_seconds": round(time.monotonic() - started, 1)}
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
    homes = 4 if args.kill_after else 3
    delays = (args.delays_ms * homes)[:homes]
    with tempfile.TemporaryDirectory(prefix="dkb-long-lab-") as root, \
            TaskNet.running(Path(root) / "net", compute=homes, mbit=args.mbit, home_delay_ms=delays) as net:
        crew = netlab_crew(net, args.mbit, delays)

        def fetch(task_id: str, out: Path) -> dict:   # from a public host, reaching the homes through the relays
            return json.loads(net.cli("task", "fetch", task_id, "--out", str(out), "--rpc",
                                      net.testnet.nodes[0].rpc_url, "--key", str(net.testnet.faucet_key), "--json"))
        return {**measure(crew, args, fetch), "bench_seconds": round(time.monotonic() - started, 1)}


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
    parser.add_argument("--kill-after", type=int, default=0, metavar="N",
                        help="a fourth compute node stands by; SIGKILL a worker once it committed N epochs: the "
                             "ledger names the spare to its seat (0: no churn)")
    for flag, kind in (("--inner-steps", int), ("--fragments", int), ("--overlap", int), ("--lr", float),
                       ("--outer-lr", float), ("--outer-momentum", float)):
        parser.add_argument(flag, type=kind, help="--recipe: over the recipe's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--netlab", action="store_true", help="over NAT'd, shaped homes (as root)")
    parser.add_argument("--mbit", type=float, default=25.0, help="--netlab: each home's uplink and downlink")
    parser.add_argument("--delays-ms", type=lambda s: [float(x) for x in s.split(",")],
                        default=[20.0, 30.0, 40.0, 50.0], help="--netlab: each home's one-way WAN delay, ms")
    args = parser.parse_args()
    if args.kill_after and args.kill_after > args.epochs - 2:
        parser.error(f"--kill-after {args.kill_after}: a spare joins at an epoch boundary after the one the worker "
                     f"dies in, so it must be at most --epochs - 2 ({args.epochs - 2})")
    print(json.dumps(run_netlab(args) if args.netlab else run(args)))


if __name__ == "__main__":
    main()

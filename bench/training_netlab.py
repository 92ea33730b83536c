"""Training over home links in the netlab (issue 23's benchmark): four real dekube Nodes, each in its
own home behind a NAT router (homes 1, 2, 4 endpoint-independent, home 3 symmetric: its links stay
relayed), uplinks and downlinks capped by ``tc tbf`` (``--mbit``, 25 by default), each home's WAN link
through a userspace delay line (``--delays-ms``, one way; netem is not in this kernel), two relays on
the public backbone. Each Node runs the workers' trainer (devtools/netlab/train_agent.py) with its
averages over the network all-reduce on its bulk connections. In one run, one after another on the
same crew: the char transformer of bench/convergence.py (Shakespeare) trained with data-parallel
fp32, DiLoCo int8 and streaming DiLoCo int4, the same steps and batches each.

Prints one line per run and, last, one JSON object: ``utilization`` (streaming's compute time / wall
time of its slowest worker, training only), ``bytes_vs_dp`` (data-parallel bytes / streaming bytes per
worker), ``loss_gap`` ((streaming eval loss - data-parallel's) / data-parallel's, at equal steps),
``utilization_least`` (the least of any worker's), the same for DiLoCo int8, data-parallel's
utilization, and ``join_s``, ``kill_recovered``, ``long_task_paid`` as null with the reason (this
bench drives trainers, not tasks on a chain: see bench/crew_change.py, bench/state_catch_up.py and bench/long_task.py).
With ``--crew-change`` it then runs ``bench/crew_change.py --netlab`` with the same links (a task on a chain
over NAT'd homes, a worker SIGKILLed after its first epoch and replaced) and reports its ``join_s`` and
``kill_recovered``; with ``--long-task``, ``bench/long_task.py --netlab`` with the same links (a task of
>= 30 min of compute on a chain: the char transformer in streaming DiLoCo int4 over 3 NAT'd homes, ~36 min)
and its ``long_task_paid``.

    sudo python bench/training_netlab.py --short            # 60 steps, H = 30
    sudo python bench/training_netlab.py --steps 240 --inner-steps 30 --warmup 60
    sudo python bench/training_netlab.py --short --crew-change   # with join_s and kill_recovered
    sudo python bench/training_netlab.py --short --long-task     # with long_task_paid (~40 min more)
    sudo python bench/training_netlab.py --steps 600 --inner-steps 100 --warmup 0 --fragments 2 --overlap 10 \
        --lr 0.016 --outer-lr 1.0 --dp-reference-lr 0.016      # the issue's targets (docs/BENCHMARKS.md)

``--lr``, ``--outer-lr``, ``--outer-momentum``, ``--fragments``, ``--overlap``, ``--mix``, ``--codec`` set
DiLoCo's and streaming's hyper-parameters (default: their recipes'); data-parallel keeps its recipe.
``--dp-reference-lr`` adds a data-parallel fp32 run at that learning rate and reports the loss gaps
against it too (``loss_gap_vs_dp_reference``): the recipe's data-parallel is the issue's baseline, but a
gap measured against a baseline tuned less than the method is worth knowing. ``--modes`` runs only some
of the modes (e.g. ``streaming-int4`` to measure its utilization alone; no summary against
data-parallel then).

The four Nodes, the relays and the delay lines share this machine's cores, so a step's wall time is
several times a dedicated worker's, and waits for a co-worker's turn on the CPU count as idle.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.netlab.lab import unavailable  # noqa: E402
from devtools.netlab.nodes import AgentError, Node  # noqa: E402
from devtools.netlab.train_net import HOME_NATS, WORKERS, paths, settle, start_crew, train  # noqa: E402
from ml.train.recipes import recipe  # noqa: E402
from ml.train.spec import InvalidSpec, TrainSpec  # noqa: E402

CHAIN_BENCHES = ("this bench drives trainers, not tasks on a chain: a worker killed and replaced on a devnet is "
                 "bench/crew_change.py, a joiner's state catch-up over netlab homes bench/state_catch_up.py")


MODES = ("data-parallel-fp32", "diloco-int8", "streaming-int4")
REFERENCE = "data-parallel-fp32-reference"
OUTER_FLAGS = {"lr": "lr", "outer_lr": "outer_lr", "outer_momentum": "outer_momentum"}
STREAMING_FLAGS = {"fragments": "fragments", "overlap": "overlap_steps", "mix": "mix", "codec": "codec"}


def plan(args) -> list[tuple[str, TrainSpec]]:
    """Every mode's spec, built (and so checked) before the lab starts: a bad ``--inner-steps`` or
    ``--overlap`` fails at once, not after the data-parallel run. Data-parallel first (the baseline)."""
    unknown = set(args.modes) - set(MODES)
    if unknown:
        raise InvalidSpec(f"unknown modes {sorted(unknown)}; known: {list(MODES)}")
    outer = {"steps": args.steps, "warmup_steps": args.warmup, "inner_steps": args.inner_steps,
             **{field: getattr(args, flag) for flag, field in OUTER_FLAGS.items() if getattr(args, flag) is not None}}
    streaming = {**outer, **{field: getattr(args, flag) for flag, field in STREAMING_FLAGS.items()
                             if getattr(args, flag) is not None}}
    modes = [("data-parallel-fp32", "shakespeare-data-parallel", {"steps": args.steps}),
             ("diloco-int8", "shakespeare-diloco", outer),
             ("streaming-int4", "shakespeare-streaming", streaming)]
    if args.dp_reference_lr is not None:
        modes.insert(1, (REFERENCE, "shakespeare-data-parallel", {"steps": args.steps, "lr": args.dp_reference_lr}))
    return [(label, recipe(name, **overrides, report_every=args.steps)) for label, name, overrides in modes
            if label.removesuffix("-reference") in args.modes]


def run(crew: list[Node], circuits: dict[str, list[str]], label: str, spec: TrainSpec, timeout: float) -> dict:
    runs = train(crew, circuits, spec.to_dict(), timeout)
    slowest = max(runs, key=lambda r: r["wall_s"])
    result = {"label": label, "mode": spec.mode, "codec": spec.codec, "steps": spec.steps,
              "inner_steps": spec.inner_steps if spec.outer_mode else None,
              "bytes_per_worker": max(r["bytes_sent"] for r in runs),
              "train_seconds": round(slowest["wall_s"], 1), "compute_seconds": round(slowest["compute_s"], 1),
              "utilization": round(slowest["compute_s"] / slowest["wall_s"], 4),
              "utilization_least": round(min(r["compute_s"] / r["wall_s"] for r in runs), 4),
              "streaming_wait_seconds": round(slowest["wait_s"], 2),
              **{k: round(v, 4) for k, v in runs[0]["metrics"].items()}}
    print(json.dumps(result), flush=True)
    return {**result, "spec": spec.to_dict()}


def summarize(results: dict[str, dict], args) -> dict:
    dp, reference = results["data-parallel-fp32"], results.get(REFERENCE)

    def against_dp(other: dict) -> dict:
        figures = {"bytes_vs_dp": round(dp["bytes_per_worker"] / other["bytes_per_worker"], 1),
                   "loss_gap": round((other["loss"] - dp["loss"]) / dp["loss"], 4), "utilization": other["utilization"],
                   "utilization_least": other["utilization_least"]}
        if reference is not None:
            figures["loss_gap_vs_dp_reference"] = round((other["loss"] - reference["loss"]) / reference["loss"], 4)
        return figures

    streaming = results["streaming-int4"]
    settings = {"lr", "outer_lr", "outer_momentum", "fragments", "overlap_steps", "mix", "codec"}
    return {"workers": len(WORKERS), "nats": HOME_NATS, "link_mbit": args.mbit, "delays_ms": args.delays_ms,
            "steps": args.steps, "inner_steps": args.inner_steps, "warmup_steps": args.warmup,
            "streaming_spec": {k: v for k, v in streaming["spec"].items() if k in settings},
            **against_dp(streaming),
            "join_s": None, "join_s_reason": CHAIN_BENCHES,
            "kill_recovered": None, "kill_recovered_reason": CHAIN_BENCHES,
            "long_task_paid": None,
            "long_task_paid_reason": "this bench trains on netlab Nodes without a chain; a >= 30 min paid task "
                                     "is --long-task (bench/long_task.py --netlab)",
            "streaming_int4": {**against_dp(streaming), "MB_per_worker": round(streaming["bytes_per_worker"] / 1e6, 3),
                               "bits_per_char": streaming["bits_per_char"]},
            "diloco_int8": {**against_dp(results["diloco-int8"]),
                            "MB_per_worker": round(results["diloco-int8"]["bytes_per_worker"] / 1e6, 3),
                            "bits_per_char": results["diloco-int8"]["bits_per_char"]},
            "data_parallel_fp32": {"utilization": dp["utilization"], "bits_per_char": dp["bits_per_char"],
                                   "MB_per_worker": round(dp["bytes_per_worker"] / 1e6, 3)},
            **({} if reference is None else {"data_parallel_fp32_reference": {
                "lr": reference["spec"]["lr"], "loss": reference["loss"], "bits_per_char": reference["bits_per_char"],
                "utilization": reference["utilization"]}})}


def run_crew_change(args) -> dict:
    """bench/crew_change.py's netlab run with this bench's links: a task on a chain whose worker is killed
    after its first epoch and replaced (its lab is built after this bench's is torn down)."""
    from bench import crew_change

    result = crew_change.run_netlab(crew_change.netlab_args(args.mbit, args.delays_ms))
    print(json.dumps({"crew_change": result}), flush=True)
    return result


def run_long_task(args) -> dict:
    """bench/long_task.py's netlab run with this bench's links: a task of >= 30 min of compute on a chain."""
    from bench import long_task

    result = long_task.run_netlab(long_task.netlab_args(args.mbit, args.delays_ms[:3]))
    print(json.dumps({"long_task": result}), flush=True)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="60 steps, H = 30, warmup 30")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--inner-steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=60, help="lr warmup = DiLoCo's leader-only warm start")
    parser.add_argument("--mbit", type=float, default=25.0, help="each home's uplink and downlink (tc tbf)")
    parser.add_argument("--delays-ms", type=lambda s: [float(x) for x in s.split(",")],
                        default=[20.0, 30.0, 40.0, 50.0], help="one-way delay of each home's WAN link, comma-separated")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument("--lr", type=float, help="DiLoCo's and streaming's inner (AdamW) peak lr")
    parser.add_argument("--outer-lr", type=float, help="DiLoCo's and streaming's outer Nesterov lr")
    parser.add_argument("--outer-momentum", type=float, help="DiLoCo's and streaming's outer momentum")
    parser.add_argument("--fragments", type=int, help="streaming P")
    parser.add_argument("--overlap", type=int, help="streaming tau: inner steps an outer all-reduce overlaps")
    parser.add_argument("--mix", type=float, help="streaming alpha")
    parser.add_argument("--codec", help="streaming's codec (dense: fp32, fp16, bf16, int8, int4)")
    parser.add_argument("--dp-reference-lr", type=float,
                        help="also run data-parallel fp32 at this lr and give the loss gaps against it")
    parser.add_argument("--crew-change", action="store_true",
                        help="then a task on a chain in the same kind of lab, a worker killed and replaced: "
                             "join_s and kill_recovered (bench/crew_change.py --netlab)")
    parser.add_argument("--long-task", action="store_true",
                        help="then a task of >= 30 min of compute on a chain over 3 such homes, paid or not: "
                             "long_task_paid (bench/long_task.py --netlab)")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES),
                        help=f"comma-separated subset of {','.join(MODES)} (the summary needs all three)")
    args = parser.parse_args(argv)
    if args.short:
        args.steps, args.inner_steps, args.warmup = 60, 30, 30
    return args


def main() -> None:
    args = parse_args()
    try:
        modes = plan(args)
    except InvalidSpec as exc:
        sys.exit(f"bad arguments: {exc}")
    why = unavailable()
    if why:
        sys.exit(f"the netlab cannot be built here: {why}")
    started = time.monotonic()
    net, crew = start_crew(len(WORKERS), args.mbit, args.delays_ms)
    try:
        circuits, settled = settle(crew)
        print(json.dumps({"paths": settled}), flush=True)
        results, failed = {}, {}
        for label, spec in modes:   # a run that fails (with the pairs' paths after it) spares the others
            try:
                results[label] = run(crew, circuits, label, spec, args.timeout)
            except AgentError as exc:
                failed[label] = {"error": str(exc), "paths_after": paths(crew)}
                print(json.dumps({"label": label, **failed[label]}), flush=True)
    finally:
        net.close()
    crew_change = run_crew_change(args) if args.crew_change else None
    long_task = run_long_task(args) if args.long_task else None
    if set(MODES) <= set(results):
        summary = summarize(results, args)
        if crew_change is not None:
            summary.update(join_s=crew_change["join_s"], kill_recovered=crew_change["kill_recovered"],
                           crew_change=crew_change)
            del summary["join_s_reason"], summary["kill_recovered_reason"]
        if long_task is not None:
            summary.update(long_task_paid=long_task["long_task_paid"], long_task=long_task)
            del summary["long_task_paid_reason"]
        print(json.dumps({**summary, "paths": settled, "failed": failed,
                          "bench_seconds": round(time.monotonic() - started, 1)}))
    elif failed:
        sys.exit(f"failed: {sorted(failed)}")


if __name__ == "__main__":
    main()

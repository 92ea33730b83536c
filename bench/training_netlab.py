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
worker), ``loss_gap`` ((streaming eval loss - data-parallel's) / data-parallel's, at equal steps), the
same for DiLoCo int8, data-parallel's utilization, and ``join_s``, ``kill_recovered``,
``long_task_paid`` as null with the reason (this bench drives trainers, not tasks on a chain: see
bench/crew_change.py, bench/state_catch_up.py and bench/long_task.py).

    sudo python bench/training_netlab.py --short            # 60 steps, H = 30
    sudo python bench/training_netlab.py --steps 240 --inner-steps 30 --warmup 60

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
from devtools.netlab.nodes import Node  # noqa: E402
from devtools.netlab.train_net import HOME_NATS, WORKERS, settle, start_crew, train  # noqa: E402
from ml.train.recipes import recipe  # noqa: E402
from ml.train.spec import InvalidSpec, TrainSpec  # noqa: E402

CHAIN_BENCHES = ("this bench drives trainers, not tasks on a chain: a worker killed and replaced on a devnet is "
                 "bench/crew_change.py, a joiner's state catch-up over netlab homes bench/state_catch_up.py")


def plan(args) -> list[tuple[str, TrainSpec]]:
    """Every mode's spec, built (and so checked) before the lab starts: a bad ``--inner-steps`` fails
    at once, not after the data-parallel run."""
    outer = {"steps": args.steps, "warmup_steps": args.warmup, "inner_steps": args.inner_steps}
    modes = [("data-parallel-fp32", "shakespeare-data-parallel", {"steps": args.steps}),
             ("diloco-int8", "shakespeare-diloco", outer),
             ("streaming-int4", "shakespeare-streaming", outer)]
    return [(label, recipe(name, **overrides, report_every=args.steps)) for label, name, overrides in modes]


def run(crew: list[Node], circuits: dict[str, list[str]], label: str, spec: TrainSpec, timeout: float) -> dict:
    runs = train(crew, circuits, spec.to_dict(), timeout)
    slowest = max(runs, key=lambda r: r["wall_s"])
    result = {"label": label, "mode": spec.mode, "codec": spec.codec, "steps": spec.steps,
              "inner_steps": spec.inner_steps if spec.outer_mode else None,
              "bytes_per_worker": max(r["bytes_sent"] for r in runs),
              "train_seconds": round(slowest["wall_s"], 1), "compute_seconds": round(slowest["compute_s"], 1),
              "utilization": round(slowest["compute_s"] / slowest["wall_s"], 4),
              "streaming_wait_seconds": round(slowest["wait_s"], 2),
              **{k: round(v, 4) for k, v in runs[0]["metrics"].items()}}
    print(json.dumps(result), flush=True)
    return result


def summarize(results: dict[str, dict], args) -> dict:
    dp = results["data-parallel-fp32"]

    def against_dp(other: dict) -> dict:
        return {"bytes_vs_dp": round(dp["bytes_per_worker"] / other["bytes_per_worker"], 1),
                "loss_gap": round((other["loss"] - dp["loss"]) / dp["loss"], 4), "utilization": other["utilization"]}

    streaming = results["streaming-int4"]
    return {"workers": len(WORKERS), "nats": HOME_NATS, "link_mbit": args.mbit, "delays_ms": args.delays_ms,
            "steps": args.steps, "inner_steps": args.inner_steps, "warmup_steps": args.warmup,
            **against_dp(streaming),
            "join_s": None, "join_s_reason": CHAIN_BENCHES,
            "kill_recovered": None, "kill_recovered_reason": CHAIN_BENCHES,
            "long_task_paid": None,
            "long_task_paid_reason": "this bench trains on netlab Nodes without a chain; a >= 30 min paid task "
                                     "is bench/long_task.py",
            "streaming_int4": {**against_dp(streaming), "MB_per_worker": round(streaming["bytes_per_worker"] / 1e6, 3),
                               "bits_per_char": streaming["bits_per_char"]},
            "diloco_int8": {**against_dp(results["diloco-int8"]),
                            "MB_per_worker": round(results["diloco-int8"]["bytes_per_worker"] / 1e6, 3),
                            "bits_per_char": results["diloco-int8"]["bits_per_char"]},
            "data_parallel_fp32": {"utilization": dp["utilization"], "bits_per_char": dp["bits_per_char"],
                                   "MB_per_worker": round(dp["bytes_per_worker"] / 1e6, 3)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="60 steps, H = 30, warmup 30")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--inner-steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=60, help="lr warmup = DiLoCo's leader-only warm start")
    parser.add_argument("--mbit", type=float, default=25.0, help="each home's uplink and downlink (tc tbf)")
    parser.add_argument("--delays-ms", type=lambda s: [float(x) for x in s.split(",")],
                        default=[20.0, 30.0, 40.0, 50.0], help="one-way delay of each home's WAN link, comma-separated")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    args = parser.parse_args()
    if args.short:
        args.steps, args.inner_steps, args.warmup = 60, 30, 30
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
        circuits, paths = settle(crew)
        print(json.dumps({"paths": paths}), flush=True)
        results = {label: run(crew, circuits, label, spec, args.timeout) for label, spec in modes}
    finally:
        net.close()
    print(json.dumps({**summarize(results, args), "paths": paths,
                      "bench_seconds": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()

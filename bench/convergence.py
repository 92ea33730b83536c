"""Convergence benchmark: training quality versus bytes sent, per codec and for DiLoCo (streaming too).

Digits (4 simulated workers): test accuracy of data-parallel training per codec and of DiLoCo.
Shakespeare: validation bits per character of fp32 data-parallel versus DiLoCo + int8, with the
total bytes each worker sent (the DiLoCo warm-start rounds included). Both train the same steps on
the same batches from the same initial model. Target: DiLoCo + int8 within 2% of fp32's bits per
char with at least 100x fewer bytes. Prints one line per run and, last, one JSON object with
everything.

    python bench/convergence.py [--jobs 2] [--skip-shakespeare] [--shakespeare-steps 3000]

`--streaming` instead runs Shakespeare fp32 data-parallel, DiLoCo + int8 and streaming DiLoCo + int4
(docs/adr/0191) side by side for `--stream-steps` steps, each worker's averages arriving over an
emulated uplink (`--link-mbit`, `--latency-ms` one way: a round takes 2 x latency + bytes / rate, a
sleep that costs no CPU, so streaming's inner steps overlap it). The summary gives streaming's (and
DiLoCo's) `bytes_vs_dp` (data-parallel bytes / its bytes per worker), `loss_gap` ((its eval loss -
data-parallel's) / data-parallel's, at equal steps) and `utilization` (compute time / wall time of
the slowest worker, training only) of each; per run, `link_seconds` is the slowest worker's emulated
link time in all (blocking for data-parallel and DiLoCo) and `streaming_wait_seconds` the part of it
streaming did not hide behind inner steps. The workers share this machine's cores, so a step's wall
time is several times a dedicated worker's, and waits for a co-worker's turn on the CPU count as idle.

    python bench/convergence.py --streaming [--stream-steps 300] [--jobs 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DIGITS_CODECS = {  # label -> (codec, codec options)
    "fp32": ("fp32", {}), "fp16": ("fp16", {}), "int8": ("int8", {}), "int4": ("int4", {}),
    "powersgd1": ("powersgd1", {}), "sign": ("sign", {}), "topk1%": ("topk", {"ratio": 0.01}),
}


def run_one(label: str, recipe_name: str, overrides: dict, world: int) -> dict:
    from ml.train.diloco import leader_rounds
    from ml.train.recipes import recipe
    from ml.train.simulation import train_simulated

    spec = recipe(recipe_name, **overrides)
    started = time.monotonic()
    run = train_simulated(spec, world)
    result = {
        "label": label,
        "mode": spec.mode,
        "codec": spec.codec,
        "steps": spec.steps,
        "inner_steps": spec.inner_steps if spec.mode == "diloco" else None,
        "warm_start_rounds": leader_rounds(spec) if spec.mode == "diloco" else None,
        "bytes_per_worker": run.bytes_sent_per_worker,
        "seconds": round(time.monotonic() - started, 1),
        **{k: round(v, 4) for k, v in run.metrics[0].items()},
    }
    print(json.dumps(result), flush=True)
    return result


class EmulatedLink:
    """A worker's averager behind an uplink of `mbit` Mbit/s with `latency_s` one-way delay: each round's
    average arrives 2 * latency + bytes sent / rate after the in-process group delivered it."""

    def __init__(self, inner, mbit: float, latency_s: float):
        self.inner, self.rate, self.latency = inner, mbit * 1e6 / 8, latency_s
        self.seconds = 0.0   # emulated link time in all (hidden behind inner steps or waited for)

    async def average(self, tensors, round_id: int):
        result = await self.inner.average(tensors, round_id)
        delay = 2 * self.latency + result.bytes_sent / self.rate
        self.seconds += delay
        await asyncio.sleep(delay)
        return result


def run_linked(label: str, recipe_name: str, overrides: dict, world: int, mbit: float, latency_s: float) -> dict:
    """One job of `world` in-process workers, each behind an EmulatedLink; training timed apart from
    the final evaluation."""
    from ml.train.recipes import recipe
    from ml.train.simulation import make_trainer, simulated_group

    spec = recipe(recipe_name, **overrides)
    group = simulated_group(spec, world)
    links = [EmulatedLink(group.member(rank), mbit, latency_s) for rank in range(world)]
    trainers = [make_trainer(spec, rank, world, links[rank]) for rank in range(world)]
    walls: dict[int, float] = {}

    async def train(trainer) -> None:
        started = time.monotonic()
        if spec.outer_mode:
            while trainer.outer_step < spec.outer_steps:
                await trainer.outer_round()
        else:
            while trainer.step < spec.steps:
                await trainer.train_step()
        walls[trainer.rank] = time.monotonic() - started

    async def train_all() -> dict:
        await asyncio.gather(*(train(t) for t in trainers))
        return await trainers[0].evaluate()

    metrics = asyncio.run(train_all())
    slowest = max(trainers, key=lambda t: t.compute_seconds)
    result = {
        "label": label, "mode": spec.mode, "codec": spec.codec, "steps": spec.steps,
        "bytes_per_worker": max(t.bytes_sent for t in trainers),
        "train_seconds": round(max(walls.values()), 1),
        "compute_seconds": round(slowest.compute_seconds, 1),
        "utilization": round(slowest.compute_seconds / walls[slowest.rank], 4),
        "link_seconds": round(links[slowest.rank].seconds, 2),
        "streaming_wait_seconds": round(getattr(slowest, "wait_seconds", 0.0), 2),
        **{k: round(v, 4) for k, v in metrics.items()},
    }
    print(json.dumps(result), flush=True)
    return result


def streaming_plan(args) -> list[tuple[str, str, dict]]:
    outer = {"steps": args.stream_steps, "warmup_steps": args.stream_warmup}
    if args.inner_steps is not None:
        outer["inner_steps"] = args.inner_steps
    return [("data-parallel-fp32", "shakespeare-data-parallel", {"steps": args.stream_steps}),
            ("diloco-int8", "shakespeare-diloco", outer),
            ("streaming-int4", "shakespeare-streaming", outer)]


def summarize_streaming(results: dict[str, dict], args) -> dict:
    dp = results["data-parallel-fp32"]

    def against_dp(run: dict) -> dict:
        return {"bytes_vs_dp": round(dp["bytes_per_worker"] / run["bytes_per_worker"], 1),
                "loss_gap": round((run["loss"] - dp["loss"]) / dp["loss"], 4),
                "utilization": run["utilization"]}

    streaming = results["streaming-int4"]
    return {"world": args.world, "steps": args.stream_steps, "link_mbit": args.link_mbit,
            "latency_ms": args.latency_ms, **against_dp(streaming),
            "streaming_int4": {**against_dp(streaming), "bits_per_char": streaming["bits_per_char"],
                               "MB_per_worker": round(streaming["bytes_per_worker"] / 1e6, 3)},
            "diloco_int8": {**against_dp(results["diloco-int8"]),
                            "bits_per_char": results["diloco-int8"]["bits_per_char"],
                            "MB_per_worker": round(results["diloco-int8"]["bytes_per_worker"] / 1e6, 3)},
            "data_parallel_fp32": {"utilization": dp["utilization"], "bits_per_char": dp["bits_per_char"],
                                   "MB_per_worker": round(dp["bytes_per_worker"] / 1e6, 3)}}


def plan(args) -> list[tuple[str, str, dict]]:
    runs = []
    if not args.skip_digits:
        for label, (codec, options) in DIGITS_CODECS.items():
            runs.append((f"digits/{label}", "digits-data-parallel",
                         {"codec": codec, "codec_options": options, "steps": args.digits_steps}))
        runs.append(("digits/diloco-fp32", "digits-diloco", {"steps": args.digits_steps}))
        runs.append(("digits/diloco-int8", "digits-diloco", {"steps": args.digits_steps, "codec": "int8"}))
    if not args.skip_shakespeare:
        steps = args.shakespeare_steps
        runs.append(("shakespeare/fp32", "shakespeare-data-parallel", {"steps": steps}))
        diloco = {"steps": steps}
        if args.inner_steps is not None:
            diloco["inner_steps"] = args.inner_steps
        runs.append(("shakespeare/diloco-int8", "shakespeare-diloco", diloco))
    return runs


def summarize(results: dict[str, dict], args) -> dict:
    summary: dict = {"world": args.world}
    digits = {k.split("/", 1)[1]: v for k, v in results.items() if k.startswith("digits/")}
    if digits:
        summary["digits"] = {k: {"accuracy": v["accuracy"], "MB_per_worker": round(v["bytes_per_worker"] / 1e6, 3)}
                             for k, v in digits.items()}
    if "shakespeare/fp32" in results and "shakespeare/diloco-int8" in results:
        base, diloco = results["shakespeare/fp32"], results["shakespeare/diloco-int8"]
        summary["shakespeare"] = {
            "steps": base["steps"],
            "inner_steps": diloco["inner_steps"],
            "warm_start_rounds": diloco["warm_start_rounds"],
            "fp32_bpc": base["bits_per_char"],
            "fp32_MB_per_worker": round(base["bytes_per_worker"] / 1e6, 3),
            "diloco_int8_bpc": diloco["bits_per_char"],
            "diloco_int8_MB_per_worker": round(diloco["bytes_per_worker"] / 1e6, 3),
            "bpc_gap_pct": round(100 * (diloco["bits_per_char"] / base["bits_per_char"] - 1), 2),
            "bytes_ratio": round(base["bytes_per_worker"] / diloco["bytes_per_worker"], 1),
        }
        s = summary["shakespeare"]
        s["target_met"] = s["bpc_gap_pct"] <= 2.0 and s["bytes_ratio"] >= 100
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (one process each)")
    parser.add_argument("--digits-steps", type=int, default=1200)
    parser.add_argument("--shakespeare-steps", type=int, default=3000)
    parser.add_argument("--inner-steps", type=int, default=None,
                        help="DiLoCo H on Shakespeare (default: the recipe's)")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--skip-shakespeare", action="store_true")
    parser.add_argument("--streaming", action="store_true",
                        help="data-parallel fp32, DiLoCo int8 and streaming DiLoCo int4 over an emulated link")
    parser.add_argument("--stream-steps", type=int, default=300)
    parser.add_argument("--stream-warmup", type=int, default=60, help="--streaming: DiLoCo lr warmup (warm start)")
    parser.add_argument("--link-mbit", type=float, default=25.0)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    args = parser.parse_args()
    if args.streaming:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = {label: pool.submit(run_linked, label, name, overrides, args.world, args.link_mbit,
                                          args.latency_ms / 1000)
                       for label, name, overrides in streaming_plan(args)}
            results = {label: future.result() for label, future in futures.items()}
        print(json.dumps(summarize_streaming(results, args)))
        return
    runs = plan(args)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {label: pool.submit(run_one, label, name, overrides, args.world)
                   for label, name, overrides in runs}
        results = {label: future.result() for label, future in futures.items()}
    print(json.dumps(summarize(results, args)))


if __name__ == "__main__":
    main()

"""Convergence benchmark: training quality versus bytes sent, per codec and for DiLoCo.

Digits (4 simulated workers): test accuracy of data-parallel training per codec and of DiLoCo.
Shakespeare: validation bits per character of fp32 data-parallel versus DiLoCo + int8, with the
total bytes each worker sent (the DiLoCo warm-start rounds included). Both train the same steps on
the same batches from the same initial model. Target: DiLoCo + int8 within 2% of fp32's bits per
char with at least 100x fewer bytes. Prints one line per run and, last, one JSON object with
everything.

    python bench/convergence.py [--jobs 2] [--skip-shakespeare] [--shakespeare-steps 3000]
"""
from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    runs = plan(args)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {label: pool.submit(run_one, label, name, overrides, args.world)
                   for label, name, overrides in runs}
        results = {label: future.result() for label, future in futures.items()}
    print(json.dumps(summarize(results, args)))


if __name__ == "__main__":
    main()

"""What the portable CPU profile (docs/adr/0166) costs against the fastest CPU kernels, in training steps/s.

For each registry model the product trains (digits-mlp, char-transformer) it runs the product's training
path (ml.train.simulation, one worker) in a fresh process per setting, side by side in one run:

- ``portable``: the portable CPU profile (ATen AVX2, MKL COMPATIBLE, oneDNN AVX2, one thread);
- ``avx2_mkl_own``: the profile's settings but MKL on its own dispatch (not portable across CPU vendors:
  MKL's AVX2 reproducibility branch exists on Intel CPUs only): MKL COMPATIBLE's share of the cost;
- ``native_1t``: the machine's own kernels (its best ATen capability, MKL's and oneDNN's own dispatch),
  one thread: the cost of the kernel settings alone;
- ``native_all``: the machine's own kernels on every core: the fastest this CPU trains.

Prints one JSON object: per model and setting steps/s (best of --repeats timed runs, each in its own
process after a warm-up, the settings taking turns), and the portable profile's slowdown against
each native setting.

    python bench/profile_cost.py [--repeats 3] [--mlp-steps 1000] [--transformer-steps 40]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ml.hardware import cpu_model  # noqa: E402  (no torch import either)
from ml.profiles import PORTABLE_CPU_ENV, apply_portable_cpu_env  # noqa: E402  (no torch import)

MODELS = {"digits-mlp": "digits", "char-transformer": "shakespeare"}
SETTINGS = ("portable", "avx2_mkl_own", "native_1t", "native_all")
WARMUP_STEPS = 5


def child(model: str, steps: int, threads: int, repeats: int) -> dict:
    """In this (fresh) process: best steps/s of ``repeats`` trainings of ``steps`` steps."""
    import torch

    from ml.train.simulation import train_simulated
    from ml.train.spec import TrainSpec

    def spec(n: int) -> TrainSpec:
        return TrainSpec(model=model, dataset=MODELS[model], steps=n, segment_steps=min(10, n),
                         report_every=max(n, 1), threads=threads, seed=1)

    train_simulated(spec(WARMUP_STEPS), world=1)   # data loading, first-call kernel set-up
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        train_simulated(spec(steps), world=1)
        best = max(best, steps / (time.perf_counter() - started))
    return {"steps_per_s": round(best, 2), "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}


def run_setting(setting: str, model: str, steps: int, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_CPU_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    threads = (os.cpu_count() or 1) if setting == "native_all" else 1
    if setting in ("portable", "avx2_mkl_own"):
        apply_portable_cpu_env(env)
    if setting == "avx2_mkl_own":
        del env["MKL_CBWR"]
    done = subprocess.run([sys.executable, __file__, "--child", model, "--steps", str(steps),
                           "--threads", str(threads), "--repeats", str(repeats)],
                          env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{setting} {model} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting (best is kept)")
    parser.add_argument("--mlp-steps", type=int, default=1000, help="digits-mlp steps per timed run")
    parser.add_argument("--transformer-steps", type=int, default=40, help="char-transformer steps per timed run")
    parser.add_argument("--child", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.threads, args.repeats)))
        return 0
    if min(args.repeats, args.mlp_steps, args.transformer_steps) < 1:
        parser.error("--repeats and the step counts must be >= 1")
    steps = {"digits-mlp": args.mlp_steps, "char-transformer": args.transformer_steps}
    models = {}
    for model in MODELS:
        runs: dict[str, dict] = {}
        for _ in range(args.repeats):   # rounds over the settings: a noisy moment hits one run, not one setting
            for setting in SETTINGS:
                run = run_setting(setting, model, steps[model], 1)
                if setting not in runs or run["steps_per_s"] > runs[setting]["steps_per_s"]:
                    runs[setting] = run
        portable = runs["portable"]["steps_per_s"]
        models[model] = {"steps": steps[model], **runs,
                         "slowdown_vs_native_1t": round(runs["native_1t"]["steps_per_s"] / portable, 3),
                         "slowdown_vs_native_all": round(runs["native_all"]["steps_per_s"] / portable, 3)}
    print(json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                      "repeats": args.repeats, "models": models}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Print, as one JSON object, the hashes of a fixed short training job under the portable CPU profile.

Run it on machines with different CPUs (Intel, AMD; with and without AVX-512) and compare: under
the portable profile (ADR 0166) the ``jobs`` hashes must be identical everywhere. ``--native`` runs
with this process's own settings instead (the machine's fastest kernels), to show what differs.

    PYTHONPATH=. python scripts/profile_hash.py [--native] [--models digits-mlp,char-transformer]

The profile's environment is applied before torch is imported, overriding whatever the caller set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ml.hardware import cpu_model  # noqa: E402  (no torch import either)
from ml.profiles import PORTABLE_CPU_ENV, apply_portable_cpu_env  # noqa: E402  (no torch import)

MODELS = {"digits-mlp": "digits", "char-transformer": "shakespeare"}
STEPS = 20
SEGMENT_STEPS = 10


def train(model: str, steps: int) -> dict:
    from ml.train.simulation import train_simulated
    from ml.train.spec import TrainSpec

    spec = TrainSpec(model=model, dataset=MODELS[model], steps=steps, segment_steps=SEGMENT_STEPS, seed=3,
                     batch_size=16)
    run = train_simulated(spec, world=2)
    first = run.trainers[0]
    return {"params_hash": first.params_hash(), "segment_hashes": list(first.segment_hashes),
            "workers_agree": len({t.params_hash() for t in run.trainers}) == 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--native", action="store_true", help="keep this process's kernel settings")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps (default {STEPS})")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models or args.steps < 1:
        parser.error(f"--models takes {', '.join(MODELS)}; --steps >= 1")
    if not args.native:
        apply_portable_cpu_env(os.environ)
    import torch

    from ml.profiles import local_profiles

    result = {"cpu": cpu_model(), "capability": torch.backends.cpu.get_cpu_capability(),
              "torch": torch.__version__, "native": args.native, "profiles": local_profiles(),
              "env": {name: os.environ.get(name) for name in PORTABLE_CPU_ENV},
              "jobs": {model: train(model, args.steps) for model in models}}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ~100M GPT-style decoder (devtools/gpt_decoder.py BIG: 12 layers, width 768) as a user's `.pt2`,
trained a few steps on CPU by the workers' trainer in streaming DiLoCo mode (int4, two fragments,
the all-reduce overlapped; `--workers` in-process workers: segment records are left out here, as
their checkpoints would hold the run's states in this process's memory; the CI smoke run of the same
code, tests/models/test_gpt_decoder.py, replays them). Prints one JSON object: parameters, archive
bytes and export seconds, seconds per inner step (each worker's compute time / its steps), bytes
each worker sent per outer step, the process's peak resident memory, and the held-out loss before
and after.

    python bench/gpt_decoder.py [--workers 2] [--steps 8] [--inner-steps 4] [--batch 1] [--context 64]

The workers share this machine's cores (and torch runs one intra-op thread each: spec.threads).
The CUDA path (spec.device = "cuda") is not exercised here.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from devtools.gpt_decoder import BIG, export_archive  # noqa: E402
from ml.train.simulation import build_simulated, run_trainers  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402
from node.artifacts.merkle import artifact_id_of_file  # noqa: E402


def tokens(path: Path, vocab: int, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    stream = (np.arange(n) * 7 + rng.integers(0, 3, n)) % vocab
    save_file({"tokens": torch.from_numpy(stream.astype(np.int64))}, str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--inner-steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=64, help="tokens per window (BIG's is 256)")
    parser.add_argument("--codec", default="int4")
    args = parser.parse_args()
    config = replace(BIG, context=args.context)
    with tempfile.TemporaryDirectory(prefix="dekube-gpt-") as folder:
        root = Path(folder)
        started = time.monotonic()
        user = export_archive(config, root / "gpt.pt2")
        export_s = time.monotonic() - started
        params = sum(p.numel() for p in user.parameters())
        del user
        train = tokens(root / "train.safetensors", config.vocab, 64 * config.context, 0)
        held_out = tokens(root / "eval.safetensors", config.vocab, config.context + 4, 1)   # 4 windows
        ids = {path: artifact_id_of_file(path) for path in (root / "gpt.pt2", train, held_out)}
        files = {artifact: path for path, artifact in ids.items()}
        spec = TrainSpec(model="pt2", dataset="file", model_artifact=ids[root / "gpt.pt2"],
                         dataset_artifact=ids[train], eval_artifact=ids[held_out],
                         mode="streaming-diloco", codec=args.codec, optimizer="adamw", lr=3e-4, steps=args.steps,
                         inner_steps=args.inner_steps, fragments=2, overlap_steps=1, batch_size=args.batch,
                         report_every=args.steps, seed=1)
        trainers = build_simulated(spec, args.workers, files=files)
        before = trainers[0]._evaluate_keeping_state()["loss"]
        started = time.monotonic()
        metrics = asyncio.run(run_trainers(trainers)).metrics
        wall_s = time.monotonic() - started
        print(json.dumps({
            "model": "gpt-12x768", "params": params, "archive_bytes": (root / "gpt.pt2").stat().st_size,
            "export_s": round(export_s, 1), "workers": args.workers, "steps": spec.steps,
            "outer_steps": spec.outer_steps, "batch": args.batch, "context": config.context, "codec": spec.codec,
            "step_s": round(max(t.compute_seconds for t in trainers) / spec.steps, 2),
            "bytes_per_outer_step": max(t.bytes_sent for t in trainers) // spec.outer_steps,
            "fp32_model_bytes": 4 * params, "wall_s": round(wall_s, 1),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "eval_loss_before": round(before, 4), "eval_loss_after": round(metrics[0]["loss"], 4),
            "device": "cpu", "threads_per_worker": spec.threads}))


if __name__ == "__main__":
    main()

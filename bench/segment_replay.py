"""Cost of a one-segment audit (docs/adr/0167): a simulated job of `--workers` workers keeping
per-segment records, then replays of single segments of single workers from their checkpoints.
Prints one JSON object: the job's wall time, the mean replay time of one segment and their ratio
(`replay_fraction`), plus the blob bytes the records produced.

    python bench/segment_replay.py --recipe digits --steps 600 --segment-steps 10
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ml.compute.segment_replay import replay_segment_blobs  # noqa: E402
from ml.train.recipes import recipe  # noqa: E402
from ml.train.simulation import build_recorded, run_trainers  # noqa: E402
from ml.train.spec import TrainSpec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="digits", help="'digits' (the default spec) or an ml.train.recipes name")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--segment-steps", type=int, default=10)
    parser.add_argument("--inner-steps", type=int, default=0, help="DiLoCo recipes: H")
    parser.add_argument("--codec", default="")
    parser.add_argument("--replays", type=int, default=3)
    args = parser.parse_args()
    base = TrainSpec() if args.recipe == "digits" else recipe(args.recipe)
    changes = {"steps": args.steps, "segment_steps": args.segment_steps, "report_every": args.steps}
    if args.inner_steps:
        changes["inner_steps"] = args.inner_steps
    if args.codec:
        changes["codec"] = args.codec
    spec = TrainSpec.from_dict({**base.to_dict(), **changes})
    trainers, sink = build_recorded(spec, args.workers)
    start = time.perf_counter()
    asyncio.run(run_trainers(trainers))
    job_s = time.perf_counter() - start
    count = spec.segment_count
    picks = [(i % args.workers, (i * 7919) % count) for i in range(args.replays)]
    times = []
    for rank, index in picks:
        start = time.perf_counter()
        got = replay_segment_blobs(spec, rank, args.workers, trainers[rank].recorder.records[index], sink.blobs,
                                   None, bytes(32))
        times.append(time.perf_counter() - start)
        assert got.match, (rank, index, got)
    replay_s = sum(times) / len(times)
    print(json.dumps({"model": spec.model, "mode": spec.mode, "codec": spec.codec, "workers": args.workers,
                      "steps": spec.steps, "segments": count, "job_s": round(job_s, 3),
                      "replay_segment_s": round(replay_s, 3), "replay_fraction": round(replay_s / job_s, 4),
                      "replay_fraction_of_one_worker": round(replay_s * args.workers / job_s, 4),
                      "blob_bytes": sum(len(b) for b in sink.blobs.values())}))


if __name__ == "__main__":
    main()

"""Benchmark of the SDBFT core in the deterministic simulator (no network, real signatures).

Reports heights simulated per CPU second (all N cores in one process, so per-node cost is this
times N) for fault-free runs and runs with faults, for 4 and 16 validators. Usage:
``python bench/consensus_sim.py [--heights 1000]``; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from consensus.simulator import SimConfig, simulate  # noqa: E402


def measure(validators: int, heights: int, faults: bool) -> dict:
    cfg = SimConfig(seed=1, validators=validators, committee_size=validators, heights=heights,
                    epoch_length=max(25, heights), crashes=faults, partitions=faults,
                    drop_rate=0.05 if faults else 0.0, byzantine=faults)
    started = time.process_time()
    result = simulate(cfg)
    cpu = time.process_time() - started
    if not result.ok:
        raise SystemExit(f"simulation failed: {result.violations[:3]}")
    return {"validators": validators, "faults": faults, "heights": min(result.heights),
            "cpu_s": round(cpu, 3), "heights_per_cpu_s": round(min(result.heights) / cpu, 1),
            "virtual_s": result.virtual_time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--heights", type=int, default=1000)
    args = parser.parse_args()
    runs = []
    for validators in (4, 16):
        for faults in (False, True):
            heights = args.heights if validators == 4 else max(50, args.heights // 5)
            run = measure(validators, heights, faults)
            print(json.dumps(run), flush=True)
            runs.append(run)
    summary = {f"v{r['validators']}_{'faults' if r['faults'] else 'clean'}_heights_per_cpu_s":
               r["heights_per_cpu_s"] for r in runs}
    print(json.dumps({"bench": "consensus_sim", **summary}))


if __name__ == "__main__":
    main()

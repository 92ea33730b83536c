"""Benchmark of the deterministic consensus simulator (devtools.consensus_sim): real drivers, cores,
ledgers and in-memory storage, real signatures, virtual time.

Reports committed heights per CPU second (all N validators in one process, so per-node cost is
this times N) for fault-free runs and runs with faults (drops, duplicates, partitions, crashes; no byzantine
validator, which with a crash would stall a 4-validator chain), for 4 and 16 validators. Usage:
``python bench/consensus_sim.py [--virtual-s 30]``; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devtools.consensus_sim.scenario import SimConfig, simulate

CLEAN = {"drop": 0.0, "duplicate": 0.0, "max_delay": 0.02, "partitions": False, "crashes": False,
         "torn_crashes": False, "byzantine": False}
FAULTS = {"drop": 0.05, "duplicate": 0.02, "max_delay": 0.05, "partitions": True, "crashes": True,
          "torn_crashes": True, "byzantine": False}


def measure(validators: int, virtual_s: float, faults: bool) -> dict:
    cfg = SimConfig(seed=1, validators=validators, fault_time=virtual_s, tx_rate=20.0,
                    **(FAULTS if faults else CLEAN))
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
    parser.add_argument("--virtual-s", type=float, default=30.0, help="simulated seconds of the fault phase")
    args = parser.parse_args()
    runs = []
    for validators in (4, 16):
        for faults in (False, True):
            run = measure(validators, args.virtual_s if validators == 4 else args.virtual_s / 3, faults)
            print(json.dumps(run), flush=True)
            runs.append(run)
    summary = {f"v{r['validators']}_{'faults' if r['faults'] else 'clean'}_heights_per_cpu_s":
               r["heights_per_cpu_s"] for r in runs}
    print(json.dumps({"bench": "consensus_sim", **summary}))


if __name__ == "__main__":
    main()

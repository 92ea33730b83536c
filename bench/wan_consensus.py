"""Consensus finality over a WAN, in the deterministic simulator (real drivers, cores, ledgers, storage).

Validators sit round-robin in ten AWS regions (CloudPing round-trip table, ``devtools/consensus_sim/wan.py``);
each payload takes RTT/2 plus up to 10% jitter, plus size/bandwidth when ``--bandwidth-mbit`` is given.
For each committee size it prints one JSON line (finality p50/p95/p99 in simulated ms, blocks/min,
rounds per height, logical bytes stored per height, wall seconds), then one summary object. Usage:
``python bench/wan_consensus.py [--validators 4 25 100] [--heights 50] [--timeout-propose 1.0 --timeout-vote 0.5]
[--tx-rate 0] [--retain-blocks 100]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devtools.consensus_sim.wan import WanConfig
from devtools.consensus_sim.wan_measure import measure, timeouts_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--validators", type=int, nargs="+", default=[4, 25, 100])
    parser.add_argument("--heights", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout-propose", type=float, default=1.0, help="[consensus] timeout_propose, seconds")
    parser.add_argument("--timeout-vote", type=float, default=0.5, help="[consensus] timeout_vote, seconds")
    parser.add_argument("--jitter", type=float, default=0.1, help="jitter ceiling, fraction of the one-way delay")
    parser.add_argument("--bandwidth-mbit", type=float, default=None, help="per-link bandwidth (default: none)")
    parser.add_argument("--tx-rate", type=float, default=2.0, help="transfers per simulated second (0: idle)")
    parser.add_argument("--retain-blocks", type=int, default=0, help="[consensus] retain_blocks (0: keep all)")
    args = parser.parse_args()
    wan = WanConfig(jitter=args.jitter,
                    bandwidth=None if args.bandwidth_mbit is None else args.bandwidth_mbit * 1e6 / 8)
    runs = []
    for validators in args.validators:
        run = measure(validators, args.heights, args.seed, wan, timeouts_for(args.timeout_propose, args.timeout_vote),
                      tx_rate=args.tx_rate, retain_blocks=args.retain_blocks)
        if run["violations"]:
            raise SystemExit(f"{validators} validators: {run['violations'][:3]}")
        run.pop("violations")
        print(json.dumps(run), flush=True)
        runs.append(run)
    keys = ("finality_p50_ms", "finality_p95_ms", "finality_p99_ms", "blocks_per_min", "rounds_mean",
            "rounds_max", "stored_bytes_per_height", "stored_bytes", "wall_s")
    print(json.dumps({"bench": "wan_consensus", "mode": "sim", "heights": args.heights,
                      "timeout_propose": args.timeout_propose, "timeout_vote": args.timeout_vote,
                      "bandwidth_mbit": args.bandwidth_mbit, "tx_rate": args.tx_rate,
                      "retain_blocks": args.retain_blocks, "validators": [r["validators"] for r in runs],
                      **{k: [r[k] for r in runs] for k in keys}}))


if __name__ == "__main__":
    main()

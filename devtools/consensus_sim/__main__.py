"""CLI: ``python -m devtools.consensus_sim --seeds 200`` (seeds 0..199) or ``--seed N`` to replay one;
``--dispute-game`` also plays the audit dispute game with byzantine parties on the ledger.

One line per seed; a failing seed prints its violations and the replay command. Exit status 1 if
any seed failed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from devtools.consensus_sim.scenario import SimConfig, simulate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.consensus_sim", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=int, default=10, help="run seeds FIRST..FIRST+SEEDS-1")
    group.add_argument("--seed", type=int, help="replay one seed, printing its full result")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--dispute-game", action="store_true",
                        help="also play the audit dispute game with byzantine parties (ADR 0170)")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first_seed, args.first_seed + args.seeds)
    failures: list[int] = []
    heights = 0
    started = time.perf_counter()
    for seed in seeds:
        result = simulate(SimConfig(seed=seed, dispute_game=args.dispute_game))
        heights += min(result.heights)
        status = "ok" if result.ok else "FAILED"
        print(f"seed={seed} {status} heights={result.heights} virtual_s={result.virtual_time} "
              f"wall_s={result.wall_time} profile={json.dumps(result.profile)} faults={json.dumps(result.faults)} "
              f"trace={result.trace[:16]}", flush=True)
        if args.seed is not None:
            print(json.dumps({"network": result.network, "txs": result.txs,
                              "byzantine_slashed": result.byzantine_slashed, **result.extra}))
        if not result.ok:
            failures.append(seed)
            for violation in result.violations[:10]:
                print(f"  seed={seed} VIOLATION {violation}")
            print(f"  replay: python -m devtools.consensus_sim --seed {seed}")
    wall = time.perf_counter() - started
    print(json.dumps({"seeds": len(seeds), "failures": failures, "heights_total": heights,
                      "wall_s": round(wall, 2)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

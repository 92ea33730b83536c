"""Consensus over a WAN with real validator processes, beside the simulator on the same latencies.

The process-level cross-check of bench/wan_consensus.py (issue 26): ``--validators`` real
``dekube-node start`` validator processes (default ``[consensus]`` settings), each in its own network
namespace, placed round-robin over the simulator's ten AWS regions; every pair of hosts is joined
through ``devtools/netlab/delay_switch.py`` with the region pair's one-way delay (CloudPing RTT / 2,
no jitter: CometBFT's per-link ``tc`` method, in userspace as netem does not exist here). A client
one zero-delay hop from every validator follows all their ``newHeads`` and sends ``--tx-rate``
transfers a second (``devtools/netlab/finality_client.py``). Then the simulator runs the same
committee over the same delays (jitter 0) for as many heights as the processes committed.

Finality = a validator's announcement of a block minus the block's time (proposal built), every
validator's commit counted, in both. The processes pay for CPU (signatures, execution, storage,
Python) on this shared 2-core machine; the simulator charges none. Needs root (namespaces). Usage:
``python bench/wan_processes.py [--validators 4 10] [--seconds 60] [--warmup 10] [--tx-rate 2]
[--scenarios clean crash slow]``; prints one JSON line per committee size and scenario, then a summary.
``crash``: v1 is SIGKILLed when the measured window starts; ``slow``: a third of the validators (equal
stake: a third of the stake) get 150 ms more one-way on every link. The simulator runs beside ``clean``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devtools.consensus_sim.wan import WanConfig  # noqa: E402
from devtools.consensus_sim.wan_measure import measure  # noqa: E402
from devtools.netlab.wan_validators import run_processes  # noqa: E402

KEYS = ("finality_p50_ms", "finality_p95_ms", "finality_p99_ms", "blocks_per_min", "rounds_mean")
TX_KEYS = ("tx_p50_ms", "tx_p99_ms")
SCENARIOS = ("clean", "crash", "slow")
SLOW_MS = 150.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--validators", type=int, nargs="+", default=[4, 10])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--tx-rate", type=float, default=2.0)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=["clean"],
                        help="clean (and the simulator beside it); crash: v1 SIGKILLed for the measured window; "
                             f"slow: {SLOW_MS:g} ms more on every link of a third of the validators")
    args = parser.parse_args()
    runs = []
    for validators in args.validators:
        for scenario in args.scenarios:
            procs = run_processes(validators, args.seconds, args.warmup, args.tx_rate,
                                  crash=1 if scenario == "crash" else 0, slow_ms=SLOW_MS if scenario == "slow" else 0.0)
            run = {"validators": validators, "scenario": scenario, "processes": procs, "sim": None,
                   "load_avg_1m": round(os.getloadavg()[0], 2)}
            if scenario == "clean":
                sim = measure(validators, max(10, procs["heights"]), wan=WanConfig(jitter=0.0), tx_rate=args.tx_rate)
                if sim["violations"]:
                    raise SystemExit(f"simulator, {validators} validators: {sim['violations'][:3]}")
                run["sim"] = {k: sim[k] for k in ("heights", *KEYS)}
            print(json.dumps(run), flush=True)
            runs.append(run)
    print(json.dumps({"bench": "wan_processes", "mode": "processes", "seconds": args.seconds,
                      "tx_rate": args.tx_rate, "validators": [r["validators"] for r in runs],
                      "scenario": [r["scenario"] for r in runs],
                      **{k: [r["processes"][k] for r in runs] for k in (*KEYS, *TX_KEYS)},
                      **{f"sim_{k}": [r["sim"][k] if r["sim"] else None for r in runs] for k in KEYS}}))


if __name__ == "__main__":
    main()

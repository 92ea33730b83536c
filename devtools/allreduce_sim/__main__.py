"""Command line: `python -m devtools.allreduce_sim --seeds 200 [--first 0] [--bug NAME] [--outages [--breaks]]
[--trace]`."""
from __future__ import annotations

import argparse
import sys

from ml.allreduce.round_core import RoundCore

from .bugs import BUGS
from .flows import FLOWS
from .run import run_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.allreduce_sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=50, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--bug", choices=sorted(BUGS), help="run a planted bug (the run must then fail)")
    parser.add_argument("--flow", choices=sorted(FLOWS), default="butterfly", help="the attempts' data flow")
    parser.add_argument("--trace", action="store_true", help="print each seed's full trace")
    parser.add_argument("--outages", action="store_true", help="faults are home links dropping for a while")
    parser.add_argument("--breaks", action="store_true", help="--outages: a write over a link that is down breaks "
                                                              "the connection (else TCP holds the frame)")
    args = parser.parse_args(argv)
    core = BUGS[args.bug] if args.bug else RoundCore
    failed = left_out = 0
    for seed in range(args.first, args.first + args.seeds):
        report = run_seed(seed, core, args.flow, args.outages, args.breaks)
        print(report.summary())
        if args.trace or not report.ok:
            for line in (report.trace if args.trace else []):
                print("   ", line)
            for problem in report.violations:
                print("    VIOLATION:", problem)
        for note in report.honest_left_out:
            print("    note:", note)
        failed += not report.ok
        left_out += bool(report.honest_left_out)
    print(f"{args.seeds - failed}/{args.seeds} seeds clean; {left_out} left a never-faulty member out of a "
          f"round after another member's fault (allowed, docs/adr/0116)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Start-up time of a command: median wall clock of N runs (hyperfine-like, no dependencies).

Usage: python bench/startup.py [--runs 5] [--warmup 1] [--cwd DIR] -- COMMAND [ARGS...]
Prints one JSON object: {"command": .., "runs_s": [..], "median_s": ..}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (page cache)")
    parser.add_argument("--cwd", default=None, help="directory to run the command in")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --")
    for _ in range(args.warmup):
        subprocess.run(command, cwd=args.cwd, stdout=subprocess.DEVNULL, check=True)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run(command, cwd=args.cwd, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    print(json.dumps({"command": " ".join(command), "runs_s": [round(t, 3) for t in times],
                      "median_s": round(statistics.median(times), 3)}))


if __name__ == "__main__":
    main()

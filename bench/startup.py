"""Start-up time of a command: median wall clock and CPU time of N runs (hyperfine-like, no dependencies).

CPU time (user + system of the child) matters on a shared, loaded machine, where the wall clock
mostly measures waiting for a core. Run ``python -c pass`` the same way for the interpreter's share.
Usage: python bench/startup.py [--runs 5] [--warmup 1] [--cwd DIR] -- COMMAND [ARGS...]
Prints one JSON object: {"command": .., "runs_s": [..], "median_s": .., "cpu_s": [..], "median_cpu_s": ..}.
"""
from __future__ import annotations

import argparse
import json
import resource
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
    times, cpu = [], []
    for _ in range(args.runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, cwd=args.cwd, stdout=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    print(json.dumps({"command": " ".join(command), "runs_s": [round(t, 3) for t in times],
                      "median_s": round(statistics.median(times), 3), "cpu_s": [round(t, 3) for t in cpu],
                      "median_cpu_s": round(statistics.median(cpu), 3)}))


if __name__ == "__main__":
    main()

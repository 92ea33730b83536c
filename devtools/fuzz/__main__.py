"""``python -m devtools.fuzz``: fuzz one target, every target (``--all``), seed or merge the corpus."""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from .runner import (
    CORPUS_DIR,
    CRASH_DIR,
    WORK_DIR,
    Options,
    child_main,
    merge_into_corpus,
    minimise_corpus,
    run_all,
    write_seeds,
)
from .targets import TARGETS, check_one


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devtools.fuzz", description=__doc__)
    parser.add_argument("target", nargs="?", choices=sorted(TARGETS), metavar="TARGET",
                        help=f"one of: {', '.join(sorted(TARGETS))}")
    parser.add_argument("--all", action="store_true", help="every target, each in its own process")
    parser.add_argument("--targets", help="with --all: a comma-separated subset")
    parser.add_argument("--runs", type=int, default=20_000, help="inputs per target (default 20000)")
    parser.add_argument("--jobs", type=int, default=1, help="targets fuzzed at once with --all (default 1)")
    parser.add_argument("--max-len", type=int, help="longest input (default: the target's)")
    parser.add_argument("--timeout", type=int, default=5, help="seconds one input may take (default 5)")
    parser.add_argument("--max-seconds", type=int, default=0, help="stop a target after this long (0: never)")
    parser.add_argument("--seed", type=int, default=0, help="libFuzzer random seed (0: random)")
    parser.add_argument("--value-profile", action="store_true", help="libFuzzer -use_value_profile=1")
    parser.add_argument("--corpus", type=Path, default=CORPUS_DIR, help="kept corpus root (read)")
    parser.add_argument("--work", type=Path, default=WORK_DIR,
                        help="where new inputs go (default fuzz/work/<target>/, gitignored)")
    parser.add_argument("--no-work", action="store_true", help="discard new inputs (a temporary work dir)")
    parser.add_argument("--crashes", type=Path, default=CRASH_DIR, help="reproducer directory")
    parser.add_argument("--logs", type=Path, help="keep each target's libFuzzer log in this directory")
    parser.add_argument("--merge", action="store_true",
                        help="after fuzzing, minimise the new inputs that add coverage into the kept corpus "
                             "(with --runs 0: merge only)")
    parser.add_argument("--minimise", action="store_true",
                        help="shrink the kept corpus to a subset with the same coverage (seeds stay)")
    parser.add_argument("--write-seeds", action="store_true", help="write the seed encodings into the corpus")
    parser.add_argument("--reproduce", type=Path, metavar="FILE", help="run one input without libFuzzer")
    parser.add_argument("--list", action="store_true", help="list the targets")
    return parser.parse_args(argv)


def _options(args: argparse.Namespace) -> Options:
    return Options(runs=args.runs, max_len=args.max_len, timeout_s=args.timeout, max_seconds=args.max_seconds,
                   corpus_dir=args.corpus, crash_dir=args.crashes, work_dir=None if args.no_work else args.work,
                   seed=args.seed, value_profile=args.value_profile, log_dir=args.logs)


def reproduce(name: str, path: Path) -> int:
    loaded = TARGETS[name].load()
    try:
        check_one(loaded, path.read_bytes())
    except BaseException:
        traceback.print_exc()
        return 1
    print(f"{name}: {path} is accepted or rejected with a documented error")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child_main(argv[1], argv[2:])
        return 0
    args = parse_args(argv)
    if args.list:
        print("\n".join(sorted(TARGETS)))
        return 0
    names = sorted(TARGETS) if args.all else [args.target] if args.target else []
    if args.all and args.targets:
        names = [n.strip() for n in args.targets.split(",") if n.strip()]
        unknown = sorted(set(names) - set(TARGETS))
        if unknown:
            print(f"unknown targets: {', '.join(unknown)}", file=sys.stderr)
            return 2
    if not names:
        print("name a TARGET or pass --all (--list lists them)", file=sys.stderr)
        return 2
    if args.reproduce:
        return reproduce(names[0], args.reproduce)
    if args.minimise:
        for name in names:
            before, after = minimise_corpus(name, _options(args))
            print(json.dumps({"target": name, "corpus_before": before, "corpus_after": after}))
        return 0
    if args.write_seeds:
        for name in names:
            print(json.dumps({"target": name, "seeds_added": write_seeds(name, args.corpus)}))
        return 0
    opts = _options(args)
    crashed = []
    if args.runs > 0:  # --runs 0 --merge: only merge what earlier runs left in the work directory
        crashed = run_all(names, opts, args.jobs)["crashed"]
    if args.merge and not args.no_work:
        for name in names:
            print(json.dumps({"target": name, "merged_into_corpus": merge_into_corpus(name, opts)}))
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

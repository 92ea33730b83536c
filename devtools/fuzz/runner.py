"""Run fuzz targets under atheris/libFuzzer, each in its own process, and report in JSON.

``run_target`` starts ``python -m devtools.fuzz --child NAME <libFuzzer flags> WORK CORPUS``: the
child instruments the decoder's packages as it imports them and hands control to libFuzzer, which
writes new inputs to WORK (first corpus directory), reads the kept corpus, and writes a crash,
timeout or out-of-memory reproducer under the crash directory. The parent reads libFuzzer's log
for the figures. ``merge_into_corpus`` minimises new inputs into the kept corpus (``-merge=1``).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .targets import TARGETS, Target

REPO_ROOT = Path(__file__).resolve().parents[2]
FUZZ_DIR = REPO_ROOT / "fuzz"
CORPUS_DIR = FUZZ_DIR / "corpus"
CRASH_DIR = FUZZ_DIR / "crashes"
WORK_DIR = FUZZ_DIR / "work"

_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_PROGRESS = re.compile(r"^#(\d+)\s", re.MULTILINE)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_START = re.compile(r"FUZZ-START ([0-9.]+)")


@dataclass(frozen=True)
class Options:
    runs: int = 20_000
    max_len: int | None = None       # default: the target's
    timeout_s: int = 5               # per input
    max_seconds: int = 0             # whole run (0: no limit)
    rss_limit_mb: int = 2048
    corpus_dir: Path = CORPUS_DIR
    crash_dir: Path = CRASH_DIR
    work_dir: Path | None = WORK_DIR  # None: a temporary directory, discarded
    seed: int = 0                     # libFuzzer's -seed (0: random)
    value_profile: bool = False
    log_dir: Path | None = None       # keep each child's libFuzzer log here


def child_command(name: str) -> list[str]:
    return [sys.executable, "-m", "devtools.fuzz", "--child", name]


def libfuzzer_flags(target: Target, opts: Options) -> list[str]:
    flags = [f"-runs={opts.runs}", f"-max_len={opts.max_len or target.max_len}", f"-timeout={opts.timeout_s}",
             f"-rss_limit_mb={opts.rss_limit_mb}", f"-artifact_prefix={opts.crash_dir}/{target.name}-",
             "-print_final_stats=1"]
    if opts.max_seconds:
        flags.append(f"-max_total_time={opts.max_seconds}")
    if opts.seed:
        flags.append(f"-seed={opts.seed}")
    if opts.value_profile:
        flags.append("-use_value_profile=1")
    return flags


def _count(path: Path) -> int:
    return sum(1 for p in path.iterdir() if p.is_file()) if path.is_dir() else 0


def run_target(name: str, opts: Options) -> dict:
    """Fuzz one target in a child process; the result line of the ``--all`` report."""
    target = TARGETS[name]
    corpus = opts.corpus_dir / name
    corpus.mkdir(parents=True, exist_ok=True)
    opts.crash_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
        work = (opts.work_dir / name) if opts.work_dir is not None else Path(tmp) / "work"
        work.mkdir(parents=True, exist_ok=True)
        before = _count(work)
        command = child_command(name) + libfuzzer_flags(target, opts) + [str(work), str(corpus)]
        started = time.time()
        proc = subprocess.run(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        ended = time.time()
        new_corpus = _count(work) - before
    log = proc.stdout
    if opts.log_dir is not None:
        opts.log_dir.mkdir(parents=True, exist_ok=True)
        (opts.log_dir / f"{name}.log").write_text(log)
    start = _START.search(log)
    fuzz_seconds = ended - float(start.group(1)) if start else ended - started
    done = _DONE.search(log)
    progress = _PROGRESS.findall(log)
    runs = int(done.group(1)) if done else (int(progress[-1]) if progress else 0)
    artifacts = _ARTIFACT.findall(log)
    result = {
        "target": name, "runs": runs, "seconds": round(ended - started, 2),
        "execs_per_s": round(runs / fuzz_seconds) if fuzz_seconds > 0 else 0,
        "crashes": len(artifacts) or (0 if proc.returncode == 0 else 1), "new_corpus": new_corpus,
    }
    if proc.returncode != 0:
        result["returncode"] = proc.returncode
        result["reproducers"] = [_shown(Path(a)) for a in artifacts]
        result["log_tail"] = log[-3000:]
        # an instrumentation artefact would pass here: only a crash of the plain code is a bug
        result["reproduces_uninstrumented"] = any(_reproduces(name, Path(a)) for a in artifacts)
    return result


def _shown(path: Path) -> str:
    """A path relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _reproduces(name: str, path: Path) -> bool:
    proc = subprocess.run([sys.executable, "-m", "devtools.fuzz", name, "--reproduce", str(path)], cwd=REPO_ROOT,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=600)
    return proc.returncode != 0


def run_all(names: list[str], opts: Options, jobs: int, out=sys.stdout) -> dict:
    """Fuzz ``names`` with ``jobs`` children at a time; one JSON line per target, then the summary."""
    started = time.time()
    results = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for result in pool.map(lambda n: run_target(n, opts), names):
            printed = {k: v for k, v in result.items() if k != "log_tail"}
            print(json.dumps(printed), file=out, flush=True)
            if result["crashes"]:
                print(result.get("log_tail", ""), file=sys.stderr, flush=True)
            results.append(result)
    summary = {
        "summary": True, "targets": len(results), "runs": sum(r["runs"] for r in results),
        "seconds": round(time.time() - started, 2), "jobs": jobs,
        "min_runs": min((r["runs"] for r in results), default=0),
        "crashed": [r["target"] for r in results if r["crashes"]],
        "new_corpus": sum(r["new_corpus"] for r in results),
    }
    print(json.dumps(summary), file=out, flush=True)
    return summary


def merge_into_corpus(name: str, opts: Options) -> int:
    """Add to the kept corpus the inputs of the work directory that add coverage; files added."""
    target = TARGETS[name]
    corpus, work = opts.corpus_dir / name, (opts.work_dir or WORK_DIR) / name
    corpus.mkdir(parents=True, exist_ok=True)
    if not work.is_dir():
        return 0
    before = _count(corpus)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-merge-{name}-") as tmp:
        command = child_command(name) + [
            f"-max_len={opts.max_len or target.max_len}", f"-timeout={opts.timeout_s}", "-merge=1",
            f"-merge_control_file={tmp}/control", str(corpus), str(work)]
        subprocess.run(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    return _count(corpus) - before


def minimise_corpus(name: str, opts: Options) -> tuple[int, int]:
    """Replace the kept corpus by the smallest subset libFuzzer finds with the same coverage
    (seeds always stay); (files before, files after)."""
    import shutil

    target = TARGETS[name]
    corpus = opts.corpus_dir / name
    before = _count(corpus)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-min-{name}-") as tmp:
        kept = Path(tmp) / "kept"
        kept.mkdir()
        subprocess.run(child_command(name) + [
            f"-max_len={opts.max_len or target.max_len}", f"-timeout={opts.timeout_s}", "-merge=1",
            f"-merge_control_file={tmp}/control", str(kept), str(corpus)],
            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        for path in corpus.iterdir():
            if not path.name.startswith("seed-"):
                path.unlink()
        for path in kept.iterdir():  # libFuzzer names files by their sha1, as seeds are after "seed-"
            if not (corpus / f"seed-{path.name}").exists():
                shutil.copy(path, corpus / path.name)
    return before, _count(corpus)


def write_seeds(name: str, corpus_dir: Path = CORPUS_DIR) -> int:
    """Write the target's valid encodings into its corpus directory (named by content); files added."""
    import hashlib

    directory = corpus_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    added = 0
    for seed in TARGETS[name].load().seeds():
        path = directory / f"seed-{hashlib.sha1(seed).hexdigest()}"
        if not path.exists():
            path.write_bytes(seed)
            added += 1
    return added


def child_main(name: str, libfuzzer_args: list[str]) -> None:
    """Inside the child: instrument and import the target, then run libFuzzer (never returns)."""
    import atheris

    from . import atheris_patch
    from .targets import check_one

    atheris_patch.apply()
    target = TARGETS[name]
    with atheris.instrument_imports(include=list(target.packages)):
        loaded = target.load()

    def test_one_input(data: bytes) -> None:
        check_one(loaded, data)

    # libFuzzer re-runs argv[0] through the shell for -merge: make it the command that reaches here
    argv0 = shlex.join(child_command(name))
    atheris.Setup([argv0, *libfuzzer_args], test_one_input)
    print(f"FUZZ-START {time.time():.3f}", file=sys.stderr, flush=True)
    atheris.Fuzz()

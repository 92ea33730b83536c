"""Untrusted model and dataset files opened first in a child process with CPU-time and memory limits
(docs/adr/0184), so that a file that gets past the static checks and still makes loading slow or huge
costs a bounded child, never the node or the owner's shell.

`check_archive` and `check_dataset` run the same loaders the training uses (`load_archive` and the
module it builds, `load_file_dataset`) in a child forked from a forkserver that imported torch once;
the child sets RLIMIT_CPU (CPU_SECONDS plus CPU_SECONDS_PER_GIB of input) and RLIMIT_AS (MEMORY_BASE
plus MEMORY_FACTOR times the tensor bytes, TEXT_MEMORY_FACTOR for text, which tokenizes into int64,
above what it has mapped), drops the environment (no keys or passphrases) and uses one thread; the
parent kills it past a wall-clock limit. Its verdict comes back as one JSON message on a pipe. A
verdict is cached per file (artifact id, path, size, mtime, parameters), so each artifact is checked
once per process. Blocking: callers on an event loop run it in a thread (the wait holds no GIL).
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import resource
import signal
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

CPU_SECONDS = 60.0
CPU_SECONDS_PER_GIB = 60.0
MEMORY_BASE = 1 << 30
MEMORY_FACTOR = 4
TEXT_MEMORY_FACTOR = 40
WALL_FACTOR = 4            # wall-clock limit: this many times the CPU limit, plus WALL_EXTRA_S
WALL_EXTRA_S = 60.0
CACHE_SIZE = 256
MAX_VERDICT_BYTES = 16_384
_KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


@dataclass(frozen=True)
class Limits:
    cpu_s: float       # CPU seconds for the load, after the child's imports
    memory: int        # bytes of address space for the load, above the child's after its imports
    wall_s: float      # the whole child, imports included


class SandboxRefused(ValueError):
    """The child ran out of its limits or crashed (the message says which)."""


def limits_for(tensor_bytes: int, factor: int = MEMORY_FACTOR) -> Limits:
    """The limits for loading a file of `tensor_bytes` (memory: MEMORY_BASE + factor x)."""
    gib = tensor_bytes / (1 << 30)
    cpu = CPU_SECONDS + CPU_SECONDS_PER_GIB * gib
    memory = MEMORY_BASE + factor * tensor_bytes
    try:
        memory = min(memory, int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8))
    except (ValueError, OSError):
        pass
    return Limits(cpu, memory, WALL_FACTOR * cpu + WALL_EXTRA_S)


_verdicts: OrderedDict[tuple, str] = OrderedDict()
_lock = threading.Lock()


def _file_key(path: Path) -> tuple:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _cached(key: tuple, run) -> str:
    with _lock:
        if key in _verdicts:
            _verdicts.move_to_end(key)
            return _verdicts[key]
    verdict = run()
    with _lock:
        _verdicts[key] = verdict
        while len(_verdicts) > CACHE_SIZE:
            _verdicts.popitem(last=False)
    return verdict


def check_archive(path: Path | str, artifact_id: str = "", limits: Limits | None = None) -> None:
    """Raise ArchiveRefused when the archive at `path` does not load within its limits in a child."""
    from ml.train.model_archive import ArchiveRefused, archive_tensor_bytes

    path = Path(path)
    tensor_bytes = archive_tensor_bytes(path)   # the static checks, in this process (bounded)
    limits = limits or limits_for(tensor_bytes)
    verdict = _cached(("archive", artifact_id, _file_key(path), limits),
                      lambda: run_child({"kind": "archive", "path": str(path)}, limits))
    if verdict:
        raise ArchiveRefused(verdict if verdict.startswith(path.name) else f"{path.name}: {verdict}")


def check_dataset(train_path: str, eval_path: str = "", tokenizer: str = "byte", context: int = 64,
                  artifact_ids: tuple[str, ...] = (), limits: Limits | None = None) -> None:
    """Raise DatasetError when the dataset files do not load within their limits in a child."""
    from ml.train.file_dataset import DatasetError

    paths = [Path(p) for p in (train_path, eval_path) if p]
    try:
        sizes = [_dataset_bytes(p) for p in paths]
        limits = limits or limits_for(sum(size for size, _ in sizes), max(factor for _, factor in sizes))
        key = ("dataset", artifact_ids, tuple(_file_key(p) for p in paths), tokenizer, context, limits)
    except OSError as exc:
        raise DatasetError(f"cannot read the dataset: {exc}") from None
    request = {"kind": "dataset", "train": train_path, "eval": eval_path, "tokenizer": tokenizer,
               "context": context}
    verdict = _cached(key, lambda: run_child(request, limits))
    if verdict:
        named = verdict.startswith(tuple(p.name for p in paths))
        raise DatasetError(verdict if named else f"{paths[0].name}: {verdict}")


def _dataset_bytes(path: Path) -> tuple[int, int]:
    """(bytes a dataset file's tensors take, memory factor): an .npz's declared sizes (refused here
    past the member bounds), else the file's size (text expands into int64 tokens)."""
    from ml.train.bounded_zip import ZipBoundError, checked_members
    from ml.train.file_dataset import MAX_UNPACKED_BYTES, DatasetError, file_format

    fmt = file_format(path)
    if fmt == "npz":
        try:
            with zipfile.ZipFile(path) as archive:   # the bounds, here: a known bomb needs no child
                members = checked_members(archive, path.name, MAX_UNPACKED_BYTES)
                return sum(info.file_size for info in members.values()), MEMORY_FACTOR
        except zipfile.BadZipFile:
            pass
        except ZipBoundError as exc:
            raise DatasetError(str(exc)) from None
    size = path.stat().st_size
    return size, TEXT_MEMORY_FACTOR if fmt == "text" else MEMORY_FACTOR


_context_lock = threading.Lock()


def _context():
    """The forkserver context: its server imports torch and the loaders once, and each check forks a
    fresh child from it (no per-check interpreter start, no fork of a threaded node)."""
    with _context_lock:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch._export.serde.serialize", "ml.train.model_archive",
                                    "ml.train.file_dataset", __name__])
        return ctx


def run_child(request: dict, limits: Limits) -> str:
    """Run `request` in a limited child: "" when it loaded, else why not."""
    ctx = _context()
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(sender, {**request, "cpu_s": limits.cpu_s,
                                                           "memory": limits.memory}), daemon=True)
    child.start()
    sender.close()
    verdict = None
    try:
        if receiver.poll(limits.wall_s):
            verdict = json.loads(receiver.recv_bytes(MAX_VERDICT_BYTES))
    except (EOFError, OSError, ValueError):
        verdict = None
    finally:
        receiver.close()
        child.join(5.0 if verdict is not None else 0.5)
        if child.is_alive():
            child.kill()
            child.join()
    if isinstance(verdict, dict) and isinstance(verdict.get("verdict"), str):
        return verdict["verdict"]
    if child.exitcode == -signal.SIGXCPU:
        return f"loading used more than {limits.cpu_s:g} s of CPU; refused"
    if child.exitcode == -signal.SIGKILL:
        return (f"loading was stopped (over {limits.cpu_s:g} s of CPU, {limits.wall_s:g} s in all, or out of "
                "memory); refused")
    return f"the loader failed (exit status {child.exitcode}); refused"


def _apply_limits(cpu_s: float, memory: int) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(usage.ru_utime + usage.ru_stime + cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory, mapped + memory))


def _load(request: dict) -> str:
    from ml.train.file_dataset import DatasetError, load_file_dataset
    from ml.train.model_archive import ArchiveRefused, load_archive

    try:
        if request["kind"] == "archive":
            load_archive(request["path"]).module()
        else:
            load_file_dataset(request["train"], request["eval"], request["tokenizer"], int(request["context"]))
        return ""
    except MemoryError:
        return _memory_verdict(request)
    except (ArchiveRefused, DatasetError) as exc:   # the loaders' own refusals, which may wrap an allocation
        return _memory_verdict(request) if _allocation_failure(str(exc)) else str(exc)
    except Exception as exc:  # torch and numpy raise many types; an allocation failure is a memory limit
        text = str(exc)
        if _allocation_failure(text):
            return _memory_verdict(request)
        return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


# How an allocation refused under RLIMIT_AS shows when it is not a MemoryError: torch's and numpy's
# messages, and a C function of the deserializer that returned NULL without setting an exception
# (a failed allocation it did not report; CPython words it two ways, by where the NULL is seen); in
# this child only the limit makes allocations fail.
_ALLOCATION_FAILURES = ("allocate", "bad_alloc", "returned NULL without setting an exception",
                        "error return without exception set")


def _allocation_failure(text: str) -> bool:
    return any(marker in text for marker in _ALLOCATION_FAILURES)


def _memory_verdict(request: dict) -> str:
    return f"loading needs more than {request['memory']} bytes of memory; refused"


def _child_main(conn, request: dict) -> None:
    """In the forked child: drop the environment, one thread, the limits, then the load; one verdict."""
    import torch

    for name in list(os.environ):
        if name not in _KEPT_ENV:
            del os.environ[name]
    torch.set_num_threads(1)
    _apply_limits(float(request["cpu_s"]), int(request["memory"]))
    verdict = _load(request)
    conn.send_bytes(json.dumps({"verdict": verdict[:2000]}).encode())
    conn.close()

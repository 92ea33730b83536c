"""INTERIM: the issue-10 ml functions the compute role calls (artifact ids of a spec, dry run,
weights as bytes, hardware detection, `files=` for the trainer and the replay), taken from ml/ when
it has them and inert otherwise, so the compute role runs on a tree where they have not landed yet.
Once ml/ provides all of them the role imports them directly and this module is deleted.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path

try:
    from ml.train.dry_run import Untrainable
    from ml.train.dry_run import dry_run as _dry_run
except ImportError:  # not landed yet
    _dry_run = None

    class Untrainable(ValueError):  # type: ignore[no-redef]
        def __init__(self, reason: str):
            super().__init__(reason)
            self.reason = reason

try:
    from ml.train.inputs import artifact_ids as _artifact_ids
except ImportError:
    _artifact_ids = None

try:
    from ml.hardware import detect as _detect
except ImportError:
    _detect = None


def artifact_ids(spec) -> list[str]:
    return list(_artifact_ids(spec)) if _artifact_ids is not None else []


def dry_run(spec, files: Mapping[str, Path], world: int) -> dict | None:
    """One local step (blocking); None when ml/ has no dry run; raises Untrainable."""
    if _dry_run is None:
        return None
    if "world" in inspect.signature(_dry_run).parameters:
        return _dry_run(spec, files, world=world)
    return _dry_run(spec, files)


def detect_hardware() -> dict:
    empty = {"gpu": "", "gpu_mem_mb": 0, "gpu_tflops": 0.0, "cuda_devices": 0}
    return {**empty, **_detect()} if _detect is not None else empty


def weights_bytes(trainer) -> bytes | None:
    method = getattr(trainer, "weights_bytes", None)
    return method() if method is not None else None


def files_kwargs(function, files: Mapping[str, Path]) -> dict:
    """{"files": files} when `function` takes it (or files are needed), else {}."""
    if files or "files" in inspect.signature(function).parameters:
        return {"files": dict(files)}
    return {}

"""Bit-reproducible training: deterministic torch settings and canonical hashes of tensors.

On CUDA (docs/adr/0150) it also fixes cuBLAS's workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8, which
deterministic cuBLAS needs), turns off TF32 and cuDNN autotuning; hashes are taken of CPU copies, so
they are computed the same way on any device.

A verifier replays a training segment and compares hashes, so hashing is canonical: tensors in the
given (or sorted-name) order, each hashed with its name, dtype and shape before its raw bytes.
"""
from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

# torch imports these lazily: use_deterministic_algorithms the inductor's config, an optimizer's constructor
# dynamo. Their first imports in two threads at once (a node's first training job beside its first audit
# replay) break each other ("partially initialized module torch._inductor.utils") for the life of the
# process, so they are imported here, once, by whichever thread imports this module first.
import torch._dynamo  # noqa: F401  (imported for its side effect)
import torch._inductor.config  # noqa: F401

from ml.profiles import configure_portable_torch

_configured_threads: int | None = None
_T = TypeVar("_T")


def configure_determinism(threads: int = 1, device: str = "cpu") -> None:
    """Fixed intra-op thread count and deterministic algorithms for this process.

    torch's thread count is process-wide; asking for a different count later raises, because two
    jobs in one process with different counts would not be reproducible.
    """
    global _configured_threads
    if _configured_threads is not None and _configured_threads != threads:
        raise RuntimeError(f"torch already configured for {_configured_threads} threads, not {threads}")
    if device == "cuda":
        configure_cuda_determinism()
    configure_portable_torch(torch)   # the portable CPU profile keeps ops off oneDNN (docs/adr/0166)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    _configured_threads = threads


def configure_cuda_determinism() -> None:
    """Deterministic CUDA for this process (docs/adr/0150): cuBLAS's fixed workspace, no TF32, no cuDNN
    autotuning, deterministic algorithms. Call it before the first CUDA matmul (cuBLAS reads the
    workspace setting when it creates its handle). Serving on CUDA uses it too (docs/adr/0179)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


def _with_configured_threads(func: Callable[..., _T], *args: Any) -> _T:
    # torch.set_num_threads sets the calling thread's OpenMP team size only: a pool thread that existed
    # before configure_determinism keeps the machine's core count, and a reduction split over another
    # number of threads rounds differently (a worker and its verifier disagree). Set it in every thread.
    threads = _configured_threads or 1
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return func(*args)


async def in_compute_thread(func: Callable[..., _T], *args: Any) -> _T:
    """``asyncio.to_thread(func, *args)`` with torch's thread count set to the configured one in that
    thread first: every training computation that feeds a hash runs through this."""
    return await asyncio.to_thread(_with_configured_threads, func, *args)


def _update(digest, name: str, tensor: torch.Tensor) -> None:
    t = tensor.detach().cpu().contiguous()
    digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        digest.update(t.view(-1).view(torch.uint8).numpy())   # the raw bytes, without a copy


def hash_tensors(tensors: Iterable[torch.Tensor]) -> str:
    """sha256 hex digest of a sequence of tensors (order matters)."""
    digest = hashlib.sha256()
    for i, tensor in enumerate(tensors):
        _update(digest, str(i), tensor)
    return digest.hexdigest()


def hash_state(state: Mapping[str, object]) -> str:
    """sha256 hex digest of a (possibly nested) state dict's tensors and plain values, by sorted key."""
    digest = hashlib.sha256()
    _hash_nested(digest, "", state)
    return digest.hexdigest()


def _hash_nested(digest, prefix: str, value: object) -> None:
    if isinstance(value, torch.Tensor):
        _update(digest, prefix, value)
    elif isinstance(value, Mapping):
        for key in sorted(value, key=str):
            _hash_nested(digest, f"{prefix}/{key}", value[key])
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _hash_nested(digest, f"{prefix}[{i}]", item)
    else:
        digest.update(f"{prefix}={value!r};".encode())

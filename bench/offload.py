"""The offloading baseline of the serving benchmarks: greedy generation reading every block from disk.

A user whose memory cannot hold the model keeps each block's weights in its own safetensors file
and reads them back for every block of every step. ``write_blocks`` saves the files (fsynced, so
their pages are clean and can be dropped); ``offload_generate`` runs the generation. With
``cold=False`` the files sit in the page cache after the first step (what a machine with memory to
spare measures, flattering offloading); with ``cold=True`` each file's pages are dropped
(``posix_fadvise(POSIX_FADV_DONTNEED)``) before the run and after every read, so every read goes
to the disk, as it would for a model larger than memory. ``OffloadRun.disk_bytes`` is what the
kernel says the process fetched from storage during the run (``read_bytes`` of /proc/self/io;
None where that file is missing): for a cold run it should be about ``file_bytes``, the bytes read
through the files; for a warm run about 0. That check is the proof the cold reads hit the disk.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ml.serve.client import greedy
from ml.serve.model import DecoderBlock


@dataclass(frozen=True)
class OffloadRun:
    tokens: list[int]
    seconds: float       # the whole generation
    read_seconds: float  # of which reading the block files into the block
    file_bytes: int      # bytes read through the block files
    disk_bytes: int | None  # bytes the kernel fetched from storage meanwhile (None: not known here)

    @property
    def read_mb_per_s(self) -> float:
        return self.file_bytes / max(self.read_seconds, 1e-9) / 1e6


def _storage_read_bytes() -> int | None:
    try:
        with open("/proc/self/io") as io:
            for line in io:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def block_path(folder: Path, index: int) -> Path:
    return folder / f"block{index}.safetensors"


def write_blocks(model, folder: Path) -> None:
    """Save every block of ``model`` to ``folder`` and flush the files to disk."""
    for index, block in model.blocks.items():
        path = block_path(folder, index)
        save_file({k: v.contiguous() for k, v in block.state_dict().items()}, str(path))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)



def offload_generate(model, folder: Path, prompt: list[int], new: int, *, cold: bool) -> OffloadRun:
    """Greedy generation of ``new`` tokens after ``prompt``, every block's weights read from
    ``folder`` (written by ``write_blocks``) at every step."""
    config = model.config
    if cold:
        for index in range(config.layers):
            _drop_cache(block_path(folder, index))
    caches = model.new_caches(1, len(prompt) + new)
    block = DecoderBlock(config.width, config.heads)
    read_seconds = 0.0
    file_bytes = 0
    disk_before = _storage_read_bytes()
    began = time.perf_counter()
    out: list[int] = []
    with torch.no_grad():
        hidden = model.embed_tokens(torch.tensor([prompt]))
        for step in range(new):
            for index in range(config.layers):
                started = time.perf_counter()
                path = block_path(folder, index)
                tensors = load_file(str(path))   # may map the file: its pages stay until the tensors go
                block.load_state_dict(tensors)
                del tensors
                if cold:
                    _drop_cache(path)
                read_seconds += time.perf_counter() - started
                file_bytes += path.stat().st_size
                hidden = block(hidden, caches[index])
            out.append(greedy(model.logits(hidden)))
            hidden = model.embed_tokens(torch.tensor([[out[-1]]]), len(prompt) + step)
    seconds = time.perf_counter() - began
    disk_after = _storage_read_bytes()
    disk = None if disk_before is None or disk_after is None else disk_after - disk_before
    return OffloadRun(out, seconds, read_seconds, file_bytes, disk)


def offload_figures(model, folder: Path, prompt: list[int], new: int, expected: list[int]) -> dict:
    """Warm then cold offloading of ``model`` through files in ``folder`` (a disk-backed directory),
    as the benchmarks' JSON keys: offload_tokens_per_s is the cold figure."""
    write_blocks(model, folder)
    warm = offload_generate(model, folder, prompt, new, cold=False)
    cold = offload_generate(model, folder, prompt, new, cold=True)
    return {
        "offload_tokens_per_s": round(new / cold.seconds, 2),
        "offload_warm_tokens_per_s": round(new / warm.seconds, 2),
        "offload_read_MBps": {"warm": round(warm.read_mb_per_s, 1), "cold": round(cold.read_mb_per_s, 1)},
        "offload_disk_read_MB": {"warm": None if warm.disk_bytes is None else round(warm.disk_bytes / 1e6, 1),
                                 "cold": None if cold.disk_bytes is None else round(cold.disk_bytes / 1e6, 1),
                                 "through_files": round(cold.file_bytes / 1e6, 1)},
        "offload_identical_prefix": warm.tokens == cold.tokens == expected[:new],
    }

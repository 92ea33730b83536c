"""What accelerator this machine has, measured: CUDA device name, memory and a short matmul benchmark,
and the execution profiles this process can compute in (ml.profiles, docs/adr/0166).

Blocking (the benchmark takes a fraction of a second on a GPU): callers on an event loop use
asyncio.to_thread. Without CUDA (or torch) every figure is zero or "".
"""
from __future__ import annotations

import platform
import time
from pathlib import Path

BENCH_SIZE = 4096
BENCH_REPEATS = 10


def _matmul_tflops(torch, size: int = BENCH_SIZE, repeats: int = BENCH_REPEATS) -> float:
    gen = torch.Generator(device="cuda").manual_seed(0)   # not the default one a task's steps seed (ADR 0196)
    a = torch.randn(size, size, device="cuda", dtype=torch.float32, generator=gen)
    b = torch.randn(size, size, device="cuda", dtype=torch.float32, generator=gen)
    torch.matmul(a, b)  # warm-up (cuBLAS handle, kernels)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return 2 * size ** 3 * repeats / seconds / 1e12


def detect() -> dict:
    """{"gpu": name or "", "gpu_mem_mb": int, "gpu_tflops": float (fp32 matmul), "cuda_devices": int,
    "profiles": [profile ids]}."""
    empty = {"gpu": "", "gpu_mem_mb": 0, "gpu_tflops": 0.0, "cuda_devices": 0, "profiles": []}
    try:
        import torch
    except ImportError:
        return empty
    from ml.profiles import local_profiles

    empty["profiles"] = local_profiles()
    if not torch.cuda.is_available():
        return empty
    try:
        props = torch.cuda.get_device_properties(0)
    except RuntimeError:   # a broken driver or a device taken away: report none
        return empty
    try:
        tflops = round(_matmul_tflops(torch), 2)
    except RuntimeError:   # out of memory (another process holds the GPU), ...: not measured
        tflops = 0.0
    return {"gpu": props.name, "gpu_mem_mb": int(props.total_memory // (1024 * 1024)),
            "gpu_tflops": tflops, "cuda_devices": torch.cuda.device_count(), "profiles": empty["profiles"]}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for benchmark and profile reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

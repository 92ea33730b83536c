"""Codec benchmark: single-thread encode/decode MB/s on fp32 input, compression ratio and relative
error per codec, and PowerSGD's step times; prints one JSON object as its last line.

    python bench/codecs.py [--numel 25000000] [--repeats 3] [--sweep]

MB/s counts fp32 input bytes (4 * numel / 1e6) per second, best of `repeats`, by wall clock and by
the thread's CPU time (`*_cpu`: what one core does when the host is shared and busy). Relative error is
||decode(encode(x)) - x|| / ||x|| for one shot on Gaussian x (top-k and sign are meant to run with
error feedback, which carries what one shot loses). --sweep adds block-size variants of int8/int4/sign.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ml.codecs import ErrorFeedback, PowerSGD, get_codec, matrix_shape, to_matrix  # noqa: E402

CODECS = [
    ("fp32", {}), ("fp16", {}), ("bf16", {}), ("int8", {}), ("int4", {}),
    ("topk", {"ratio": 0.01}), ("sign", {}), ("fp16+lz4", {}), ("int8+lz4", {}),
]
SWEEP = [
    ("int8", {"block": 64}), ("int8", {"block": 256}), ("int4", {"block": 32}), ("int4", {"block": 128}),
    ("sign", {"block": 1024}), ("topk", {"ratio": 0.001}), ("topk", {"ratio": 0.1}),
]


def best_time(fn, repeats: int):
    """Best wall-clock time of `repeats` calls (also recorded: best thread CPU time, in CPU_TIMES)."""
    best, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        out = fn()
        best_cpu = min(best_cpu, time.thread_time() - start_cpu)
        best = min(best, time.perf_counter() - start)
    CPU_TIMES.append(best_cpu)
    return best, out


CPU_TIMES: list[float] = []  # thread CPU seconds of the last best_time calls (robust on a busy host)


def label(name: str, opts: dict) -> str:
    return name + "".join(f":{k}={v}" for k, v in opts.items())


def bench_codec(name: str, opts: dict, x: torch.Tensor, repeats: int) -> dict:
    codec = get_codec(name, **opts)
    mb = 4 * x.numel() / 1e6
    t_enc, data = best_time(lambda: codec.encode(x), repeats)
    t_dec, y = best_time(lambda: codec.decode(data, x.numel()), repeats)
    cpu_enc, cpu_dec = CPU_TIMES[-2:]
    rel = float((y.double() - x.double()).norm() / x.double().norm())
    return {
        "encode_MBps": round(mb / t_enc, 1),
        "decode_MBps": round(mb / t_dec, 1),
        "encode_MBps_cpu": round(mb / cpu_enc, 1),
        "decode_MBps_cpu": round(mb / cpu_dec, 1),
        "ratio": round(4 * x.numel() / len(data), 2),
        "rel_err": float(f"{rel:.4g}"),
    }


def bench_error_feedback(name: str, opts: dict, x: torch.Tensor, repeats: int) -> dict:
    """Encode throughput of ErrorFeedback around a codec (encode + decode + residual update)."""
    feedback = ErrorFeedback(get_codec(name, **opts), x.numel())
    t_enc, _ = best_time(lambda: feedback.encode(x), repeats)
    mb = 4 * x.numel() / 1e6
    return {"encode_MBps": round(mb / t_enc, 1), "encode_MBps_cpu": round(mb / CPU_TIMES[-1], 1)}


def bench_powersgd(x: torch.Tensor, rank: int, repeats: int) -> dict:
    shape = matrix_shape(x.shape)
    m = to_matrix(x, shape)
    peer = PowerSGD(shape, rank=rank, seed=0)

    def step():
        marks = [(time.perf_counter(), time.thread_time())]
        p = peer.p_step(m)
        marks.append((time.perf_counter(), time.thread_time()))
        q = peer.q_step(p)
        marks.append((time.perf_counter(), time.thread_time()))
        approx = peer.finish(q)
        marks.append((time.perf_counter(), time.thread_time()))
        wall = [marks[i + 1][0] - marks[i][0] for i in range(3)]
        cpu = [marks[i + 1][1] - marks[i][1] for i in range(3)]
        return wall, cpu, approx

    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu, approx = step()
        walls.append(wall)
        cpus.append(cpu)
    p_s, q_s, f_s = (min(t[i] for t in walls) for i in range(3))
    cpu_total = sum(min(t[i] for t in cpus) for i in range(3))
    rel = float((approx.double() - m.double()).norm() / m.double().norm())
    total = p_s + q_s + f_s
    return {
        "shape": list(shape),
        "p_step_s": round(p_s, 4),
        "q_step_s": round(q_s, 4),
        "finish_s": round(f_s, 4),
        "MBps": round(4 * x.numel() / 1e6 / total, 1),
        "MBps_cpu": round(4 * x.numel() / 1e6 / cpu_total, 1),
        "ratio": round(m.numel() / (rank * sum(shape)), 1),
        "rel_err_last_step": float(f"{rel:.4g}"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="also block-size and ratio variants")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(args.numel, generator=torch.Generator().manual_seed(0))
    results: dict[str, dict] = {}
    for name, opts in CODECS + (SWEEP if args.sweep else []):
        key = label(name, opts)
        results[key] = bench_codec(name, opts, x, args.repeats)
        print(key, results[key], flush=True)
    feedback = {}
    for name, opts in (("topk", {"ratio": 0.01}), ("sign", {}), ("int8", {})):
        feedback[label(name, opts)] = bench_error_feedback(name, opts, x, args.repeats)
        print("error feedback", label(name, opts), feedback[label(name, opts)], flush=True)
    k = get_codec("topk", ratio=0.01).k(args.numel)
    t_sort, _ = best_time(lambda: torch.topk(x.abs(), k, sorted=False), 1)
    print(f"reference: torch.topk of |x| (k={k}) {t_sort:.3f} s", flush=True)
    powersgd = {}
    for rank in (1, 4):
        powersgd[f"r{rank}"] = bench_powersgd(x, rank, args.repeats)
        print(f"powersgd r{rank}", powersgd[f"r{rank}"], flush=True)
    print(json.dumps({
        "numel": args.numel, "threads": 1, "codecs": results, "error_feedback": feedback, "powersgd": powersgd,
        "torch_topk_1pct_s": round(t_sort, 3),
    }))


if __name__ == "__main__":
    main()

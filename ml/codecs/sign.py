"""Scaled sign compression: one bit per value plus one bf16 scale (mean |x|) per block.

A value decodes to +scale if it was >= 0, else -scale (computed as 2 * scale * bit - scale, exact;
scales are capped so 2 * scale stays finite). Meant to run inside `ErrorFeedback`
(EF-SignSGD, Karimireddy et al. 2019, with per-block instead of per-tensor scales).
Layout after the header (param = block size):
    scales: ceil(numel / block) x bf16 | signs: ceil(numel / 8) bytes, little-endian bit order,
    padding bits 0.
"""
from __future__ import annotations

import numpy as np
import torch

from .base import (
    CODEC_IDS,
    HEADER_SIZE,
    CodecError,
    check_input,
    chunk_values,
    pack_header,
    read_header,
    register_codec,
    require_finite,
    require_length,
    tensor_bytes,
    view_array,
)

_MAX_SCALE_BITS = 0x7EFF  # largest bfloat16 s with 2 * s finite (decoding computes 2s * bit - s)


def _ordered_row_sums(rows: torch.Tensor) -> torch.Tensor:
    """Row sums by a fixed pairwise tree of element-wise adds (same bits on any CPU or thread count;
    torch's reductions vary their order with the SIMD width). Row length: a power of two."""
    while rows.shape[1] > 1:
        half = rows.shape[1] // 2
        rows = rows[:, :half] + rows[:, half:]
    return rows[:, 0]


def _block_means(rows: torch.Tensor, count: int) -> torch.Tensor:
    """Mean |x| of each row over its first `count` values (the rest are zero padding), float32;
    done again in float64 if the float32 sums overflow."""
    magnitudes = rows.abs()
    means = _ordered_row_sums(magnitudes) / count
    if not bool(torch.isfinite(means).all()):
        require_finite(rows)
        means = (_ordered_row_sums(magnitudes.to(torch.float64)) / count).to(torch.float32)
    return means


def _to_bf16_bits(means: torch.Tensor) -> torch.Tensor:
    """Nearest bfloat16 bit patterns, capped at _MAX_SCALE_BITS."""
    return means.to(torch.bfloat16).view(torch.int16).clamp_(max=_MAX_SCALE_BITS)


class SignCodec:
    """1 bit per value and a bf16 mean-magnitude scale per `block` values."""

    name = "sign"

    def __init__(self, block: int = 256):
        if not (8 <= block <= 32768 and block & (block - 1) == 0):
            raise ValueError("block must be a power of two in [8, 32768]")
        self.block = block
        self._id = CODEC_IDS["sign"]

    def __repr__(self) -> str:
        return f"SignCodec(block={self.block})"

    def max_encoded_size(self, numel: int) -> int:
        return HEADER_SIZE + 2 * (-(-numel // self.block)) + (numel + 7) // 8

    def encode(self, x: torch.Tensor) -> bytes:
        numel = check_input(x)
        x = x.detach()
        n_full = numel // self.block
        rows_per_chunk = max(1, chunk_values() // self.block)  # temporaries stay in cache
        means = []
        for first in range(0, n_full, rows_per_chunk):
            last = min(first + rows_per_chunk, n_full)
            means.append(_block_means(x[first * self.block : last * self.block].view(-1, self.block), self.block))
        tail = numel - n_full * self.block
        if tail:
            padded = torch.zeros(1, self.block)
            padded[0, :tail] = x[n_full * self.block :]
            means.append(_block_means(padded, tail))
        signs = np.packbits((x >= 0).numpy(), bitorder="little")
        scales = b"".join(tensor_bytes(_to_bf16_bits(m)) for m in means)
        return b"".join([pack_header(self._id, 0, self.block, numel), scales, signs.data])

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        flags, block = read_header(data, self._id, numel)
        if flags != 0:
            raise CodecError(f"sign: unknown flags {flags:#x}")
        if block != self.block:
            raise CodecError(f"sign: block size {block} in header, expected {self.block}")
        require_length(data, self.max_encoded_size(numel))
        n_blocks = -(-numel // self.block)
        scale_bits = view_array(data, np.dtype("<i2"), HEADER_SIZE, n_blocks)
        if n_blocks and not bool(((scale_bits >= 0) & (scale_bits <= _MAX_SCALE_BITS)).all()):
            raise CodecError("sign: negative or out-of-range block scale")
        scales = scale_bits.view(torch.bfloat16).to(torch.float32)
        packed = np.frombuffer(data, dtype=np.uint8, count=(numel + 7) // 8, offset=HEADER_SIZE + 2 * n_blocks)
        if numel % 8 and packed[-1] >> (numel % 8):
            raise CodecError("sign: padding bits must be 0")
        bits = torch.from_numpy(np.unpackbits(packed, count=numel, bitorder="little"))  # 1 for >= 0
        out = torch.empty(numel, dtype=torch.float32)
        n_full = numel // self.block
        rows_per_chunk = max(1, chunk_values() // self.block)  # convert and scale while in cache
        for first in range(0, n_full, rows_per_chunk):
            last = min(first + rows_per_chunk, n_full)
            span = slice(first * self.block, last * self.block)
            s = scales[first:last, None]
            out[span].copy_(bits[span]).view(-1, self.block).mul_(2 * s).sub_(s)
        if numel > n_full * self.block:
            span = slice(n_full * self.block, numel)
            s = scales[n_full]
            out[span].copy_(bits[span]).mul_(2 * s).sub_(s)
        return out


def _sign(block: int = 256) -> SignCodec:
    return SignCodec(block)


register_codec("sign", _sign)

"""Blockwise symmetric absmax quantization: int8 (levels -127..127) and int4 (-7..7, two per byte).

The one quantizer family of the project: the all-reduce and the serving wire both use it (ADR 0190).
Each block of `block` values gets one scale, of one of two kinds (header flags):
- "bf16" (flags 0, the all-reduce's): 2 bytes, the range of fp32 so tiny and huge gradient blocks
  both survive, rounded *up* from absmax/levels; values are quantized against the rounded scale, so
  the short mantissa never adds error beyond the step size (docs/adr/0031).
- "f32" (flags 1, serving's): 4 bytes, exactly absmax/levels, so a block's absmax value gets code
  +-levels and decoding then re-encoding gives the same tensor (serving checks a pushed input by
  the digest of its re-encoding; a rounded-up scale can leave the absmax at code 126).
Both kinds floor the scale at fp32's smallest normal (an all-zero block decodes to zeros).
Layout after the header (param = block size):
    scales: ceil(numel / block) x bf16 or f32 | codes: int8 per value, or int4 nibbles (value + 8,
    low nibble first; an odd count pads the last high nibble with 0).
Decoding rejects negative/NaN/too-large scales and the codes the encoder never emits (-128, and
nibble 0 for int4), so a valid encoding is always finite.
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
    require_length,
    tensor_bytes,
    view_array,
)

_SMALLEST_NORMAL = torch.finfo(torch.float32).tiny
# Adding and subtracting 1.5 * 2^23 rounds |y| < 2^22 to the nearest integer (ties to even) in fp32.
# Used instead of torch.round and per-row aminmax, which take ~20 ms even on tiny tensors when torch
# runs more than one intra-op thread on a busy machine.
_ROUNDING_MAGIC = 12582912.0


def _max_scale_bits(levels: int) -> int:
    """Largest bf16 bit pattern s with (levels + 1) * s finite in fp32."""
    limit = torch.finfo(torch.float32).max / (levels + 1)
    bits = int(torch.tensor([limit], dtype=torch.float32).view(torch.int32)) >> 16  # rounds down
    return bits


def _max_f32_scale_bits(levels: int) -> int:
    """Largest fp32 bit pattern s with levels * s finite in fp32."""
    limit = torch.tensor([torch.finfo(torch.float32).max / levels], dtype=torch.float64).to(torch.float32)
    bits = int(limit.view(torch.int32))
    while not torch.isfinite(torch.tensor([bits], dtype=torch.int32).view(torch.float32) * levels).all():
        bits -= 1
    return bits


def _round_up_to_bf16(s: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (int16) of the smallest bf16 values >= s (s >= 0, finite)."""
    bits = s.view(torch.int32)
    return ((bits + 0xFFFF) >> 16).to(torch.int16)


def _bf16_bits_to_float(bits: torch.Tensor) -> torch.Tensor:
    return (bits.to(torch.int32) << 16).view(torch.float32)


SCALE_FLAGS = {"bf16": 0, "f32": 1}


class BlockwiseCodec:
    """Symmetric absmax quantization to `bits` (8 or 4) with one `scale` ("bf16" or "f32") per
    `block` values."""

    def __init__(self, bits: int, block: int, scale: str = "bf16"):
        if bits not in (8, 4):
            raise ValueError("bits must be 8 or 4")
        if not (2 <= block <= 32768 and block % 2 == 0):
            raise ValueError("block must be even and in [2, 32768]")
        if scale not in SCALE_FLAGS:
            raise ValueError(f"scale must be one of {sorted(SCALE_FLAGS)}")
        self.bits = bits
        self.block = block
        self.scale = scale
        self.name = "int8" if bits == 8 else "int4"
        self._id = CODEC_IDS[self.name]
        self._flags = SCALE_FLAGS[scale]
        self._scale_bytes = 2 if scale == "bf16" else 4
        self._levels = 127 if bits == 8 else 7
        self._max_scale_bits = (_max_scale_bits if scale == "bf16" else _max_f32_scale_bits)(self._levels)

    def __repr__(self) -> str:
        return f"BlockwiseCodec({self.name}, block={self.block}, scale={self.scale})"

    def _sizes(self, numel: int) -> tuple[int, int]:
        n_blocks = -(-numel // self.block)
        code_bytes = numel if self.bits == 8 else (numel + 1) // 2
        return n_blocks, code_bytes

    def max_encoded_size(self, numel: int) -> int:
        n_blocks, code_bytes = self._sizes(numel)
        return HEADER_SIZE + self._scale_bytes * n_blocks + code_bytes

    def _scale_bits(self, scale: torch.Tensor) -> torch.Tensor:
        """The stored bit patterns of the block scales `scale` (>= smallest normal, finite)."""
        return _round_up_to_bf16(scale) if self.scale == "bf16" else scale.view(torch.int32)

    def _scale_values(self, bits: torch.Tensor) -> torch.Tensor:
        return _bf16_bits_to_float(bits) if self.scale == "bf16" else bits.to(torch.int32).view(torch.float32)

    # -- encode ---------------------------------------------------------------------------------

    def _quantize_rows(self, rows: torch.Tensor, scale_bits_out: torch.Tensor, codes_out: torch.Tensor) -> None:
        """rows [r, block] -> scale bits into scale_bits_out [r], codes -levels..levels into
        codes_out [r, block] (int8)."""
        absmax = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_())
        if not bool(torch.isfinite(absmax).all()):
            raise CodecError("tensor contains NaN or Inf")
        scale = (absmax / self._levels).clamp_min_(_SMALLEST_NORMAL)
        scale_bits = self._scale_bits(scale)
        saturated = bool((scale_bits > self._max_scale_bits).any())
        if saturated:  # |x| near fp32 max: cap the scale so decoding stays finite, clamp codes
            scale_bits.clamp_(max=self._max_scale_bits)
        scale_bits_out.copy_(scale_bits)
        inv = 1.0 / self._scale_values(scale_bits)
        scaled = (rows * inv[:, None]).add_(_ROUNDING_MAGIC).sub_(_ROUNDING_MAGIC)
        if saturated:
            scaled.clamp_(-self._levels, self._levels)
        codes_out.copy_(scaled)  # integral values: the float -> int8 cast is exact

    def encode(self, x: torch.Tensor) -> bytes:
        numel = check_input(x)
        x = x.detach()
        n_blocks, _ = self._sizes(numel)
        n_full = numel // self.block
        scale_bits = torch.empty(n_blocks, dtype=torch.int16 if self.scale == "bf16" else torch.int32)
        codes = torch.empty(n_blocks, self.block, dtype=torch.int8)
        rows_per_chunk = max(1, chunk_values() // self.block)  # temporaries stay in cache
        for first in range(0, n_full, rows_per_chunk):
            last = min(first + rows_per_chunk, n_full)
            rows = x[first * self.block : last * self.block].view(-1, self.block)
            self._quantize_rows(rows, scale_bits[first:last], codes[first:last])
        if n_full < n_blocks:
            padded = torch.zeros(1, self.block)
            padded[0, : numel - n_full * self.block] = x[n_full * self.block :]
            self._quantize_rows(padded, scale_bits[n_full:], codes[n_full:])
        codes = codes.view(-1)[:numel]
        packed = codes if self.bits == 8 else _pack_nibbles(codes)
        header = pack_header(self._id, self._flags, self.block, numel)
        return b"".join([header, tensor_bytes(scale_bits), tensor_bytes(packed)])

    # -- decode ---------------------------------------------------------------------------------

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        flags, block = read_header(data, self._id, numel)
        if flags != self._flags:
            raise CodecError(f"{self.name}: flags {flags:#x} in header, expected {self._flags:#x} "
                             f"({self.scale} scales)")
        if block != self.block:
            raise CodecError(f"{self.name}: block size {block} in header, expected {self.block}")
        require_length(data, self.max_encoded_size(numel))
        n_blocks, code_bytes = self._sizes(numel)
        scale_bits = view_array(data, np.dtype("<i2" if self.scale == "bf16" else "<i4"), HEADER_SIZE, n_blocks)
        # min/max reductions, not element-wise compares + any(): no temporaries, ~20x faster
        if n_blocks and not _within(scale_bits, 0, self._max_scale_bits):
            raise CodecError(f"{self.name}: negative, non-finite or out-of-range block scale")
        scales = self._scale_values(scale_bits)
        code_offset = HEADER_SIZE + self._scale_bytes * n_blocks
        if self.bits == 8:
            codes = view_array(data, np.dtype("i1"), code_offset, code_bytes)
            if numel and int(codes.min()) == -128:
                raise CodecError("int8: code -128 is never emitted")
        else:
            codes = _unpack_nibbles(view_array(data, np.dtype("u1"), code_offset, code_bytes), numel)
        out = torch.empty(numel, dtype=torch.float32)
        n_full = numel // self.block
        rows_per_chunk = max(1, chunk_values() // self.block)  # convert and scale while in cache
        for first in range(0, n_full, rows_per_chunk):
            last = min(first + rows_per_chunk, n_full)
            span = slice(first * self.block, last * self.block)
            out[span].copy_(codes[span]).view(-1, self.block).mul_(scales[first:last, None])
        if n_full < n_blocks:
            span = slice(n_full * self.block, numel)
            out[span].copy_(codes[span]).mul_(scales[n_full])
        return out


def _within(values: torch.Tensor, lo: int, hi: int) -> bool:
    low, high = torch.aminmax(values)
    return lo <= int(low) and int(high) <= hi


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes in -7..7 -> uint8 bytes, two codes (value + 8) per byte, low nibble first."""
    biased = (codes + 8).view(torch.uint8)
    if biased.numel() % 2:
        biased = torch.cat([biased, torch.zeros(1, dtype=torch.uint8)])
    pairs = biased.view(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 4)


def _unpack_nibbles(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of _pack_nibbles to int8 codes -7..7; CodecError on nibble 0 or bad padding."""
    nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=1).view(-1)
    if numel % 2 and nibbles[-1] != 0:
        raise CodecError("int4: padding nibble must be 0")
    nibbles = nibbles[:numel]
    if numel and int(nibbles.min()) == 0:
        raise CodecError("int4: nibble 0 is never emitted")
    return nibbles.view(torch.int8).sub(8)


def _int8(block: int = 128, scale: str = "bf16") -> BlockwiseCodec:
    return BlockwiseCodec(8, block, scale)


def _int4(block: int = 64, scale: str = "bf16") -> BlockwiseCodec:
    return BlockwiseCodec(4, block, scale)


register_codec("int8", _int8)
register_codec("int4", _int4)

"""Lossless lz4 framing around another codec's encoding, applied only where it pays.

Worth it for payloads with long runs or repeats (sparse gradients in fp16/fp32, all-zero blocks);
quantized dense gradients barely compress, so a probe of a few spread 64 KiB slices decides first and
the payload is kept compressed only if it shrinks by at least 1/8. Layout after the header (flags:
0 = stored, 1 = lz4 block; param = inner codec id):
    inner length: u32 (at most the inner codec's max_encoded_size) | payload
"""
from __future__ import annotations

import lz4.block
import torch

from .base import CODEC_IDS, HEADER_SIZE, Codec, CodecError, check_input, pack_header, read_header, register_codec

STORED, COMPRESSED = 0, 1
_MIN_SIZE = 1024  # smaller payloads are stored
_PROBE_SLICE = 1 << 16
_PROBE_SLICES = 4
_PROBE_RATIO = 0.9  # probe slices must compress at least this well to try the whole payload
_KEEP_RATIO = 7 / 8  # compressed payloads are kept only if at most this fraction of the original


def _probe_compresses(raw: bytes) -> bool:
    if len(raw) <= _PROBE_SLICES * _PROBE_SLICE:
        return True
    step = len(raw) // _PROBE_SLICES
    sample = b"".join(raw[i * step : i * step + _PROBE_SLICE] for i in range(_PROBE_SLICES))
    return len(lz4.block.compress(sample, store_size=False)) <= _PROBE_RATIO * len(sample)


class Lz4Framed:
    """`inner`'s encoding, lz4-compressed when that pays."""

    def __init__(self, inner: Codec):
        self.inner = inner
        self.name = f"{inner.name}+lz4"
        self._id = CODEC_IDS["lz4"]
        self._inner_id = CODEC_IDS[inner.name]

    def __repr__(self) -> str:
        return f"Lz4Framed({self.inner!r})"

    def max_encoded_size(self, numel: int) -> int:
        return HEADER_SIZE + 4 + self.inner.max_encoded_size(numel)

    def encode(self, x: torch.Tensor) -> bytes:
        numel = check_input(x)
        raw = self.inner.encode(x)
        flag, payload = STORED, raw
        if len(raw) >= _MIN_SIZE and _probe_compresses(raw):
            packed = lz4.block.compress(raw, store_size=False)
            if len(packed) <= _KEEP_RATIO * len(raw):
                flag, payload = COMPRESSED, packed
        return b"".join([pack_header(self._id, flag, self._inner_id, numel), len(raw).to_bytes(4, "little"), payload])

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        flag, inner_id = read_header(data, self._id, numel)
        if flag not in (STORED, COMPRESSED):
            raise CodecError(f"lz4: unknown flags {flag:#x}")
        if inner_id != self._inner_id:
            raise CodecError(f"lz4: inner codec id {inner_id}, expected {self._inner_id} ({self.inner.name})")
        if len(data) < HEADER_SIZE + 4:
            raise CodecError("lz4: truncated before the inner length")
        view = memoryview(data)
        inner_len = int.from_bytes(view[HEADER_SIZE : HEADER_SIZE + 4], "little")
        if inner_len > self.inner.max_encoded_size(numel):
            raise CodecError(f"lz4: inner length {inner_len} exceeds the inner codec's maximum")
        payload = view[HEADER_SIZE + 4 :]
        if flag == STORED:
            if len(payload) != inner_len:
                raise CodecError(f"lz4: stored payload is {len(payload)} bytes, header says {inner_len}")
            return self.inner.decode(payload, numel)
        try:
            raw = lz4.block.decompress(payload, uncompressed_size=inner_len)
        except lz4.block.LZ4BlockError as exc:
            raise CodecError(f"lz4: corrupt compressed payload ({exc})") from None
        if len(raw) != inner_len:
            raise CodecError(f"lz4: payload decompressed to {len(raw)} bytes, header says {inner_len}")
        return self.inner.decode(raw, numel)


register_codec("lz4", Lz4Framed)

"""Element-wise float codecs: fp32 (lossless), fp16 and bf16 (round to nearest, saturating).

fp16 saturates finite values beyond its range to +-65504 instead of producing Inf; bf16 has the
range of fp32 and only saturates at its very top. Decoding rejects NaN/Inf payloads.
"""
from __future__ import annotations

import numpy as np
import torch

from .base import (
    CODEC_IDS,
    HEADER_SIZE,
    CodecError,
    all_finite,
    check_input,
    pack_header,
    read_header,
    register_codec,
    require_finite,
    require_length,
    tensor_bytes,
    view_array,
)


class FloatCodec:
    """Casts each value to a float type of `itemsize` bytes; one class, three instances."""

    def __init__(self, name: str, dtype: torch.dtype, wire_np: np.dtype):
        self.name = name
        self._dtype = dtype
        self._wire_np = wire_np  # numpy dtype of the same width used to view the payload
        self._id = CODEC_IDS[name]
        self._itemsize = torch.finfo(dtype).bits // 8
        self._max = torch.finfo(dtype).max

    def __repr__(self) -> str:
        return f"FloatCodec({self.name})"

    def max_encoded_size(self, numel: int) -> int:
        return HEADER_SIZE + numel * self._itemsize

    def encode(self, x: torch.Tensor) -> bytes:
        numel = check_input(x)
        x = x.detach()
        if self._dtype == torch.float32:
            require_finite(x)
            y = x
        else:
            y = x.to(self._dtype)
            if not all_finite(y):
                require_finite(x)  # real NaN/Inf in the input: reject
                y = x.clamp(-self._max, self._max).to(self._dtype)  # finite overflow: saturate
        return b"".join([pack_header(self._id, 0, 0, numel), tensor_bytes(y)])

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        read_header(data, self._id, numel)
        require_length(data, self.max_encoded_size(numel))
        raw = view_array(data, self._wire_np, HEADER_SIZE, numel)
        values = raw if self._dtype == torch.float32 else raw.view(self._dtype)
        out = values.to(torch.float32, copy=True)
        if not all_finite(out):
            raise CodecError(f"{self.name} payload contains NaN or Inf")
        return out


def _fp32() -> FloatCodec:
    return FloatCodec("fp32", torch.float32, np.dtype("<f4"))


def _fp16() -> FloatCodec:
    return FloatCodec("fp16", torch.float16, np.dtype("<f2"))


def _bf16() -> FloatCodec:
    return FloatCodec("bf16", torch.bfloat16, np.dtype("<i2"))


register_codec("fp32", _fp32)
register_codec("fp16", _fp16)
register_codec("bf16", _bf16)

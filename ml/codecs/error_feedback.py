"""Error feedback: per-tensor residual memory around a lossy codec.

Each step encodes x + residual and keeps what the encoding lost, residual = (x + residual) -
decode(encoding), so nothing is dropped for good: the sum of decoded values over steps tracks the
sum of inputs to within one step's error. A failed encode (e.g. NaN input) leaves the residual as
it was. `residual` is replaced, never modified in place, so a reference kept by a checkpoint stays valid.
"""
from __future__ import annotations

import torch

from .base import Codec, CodecError, check_input


class ErrorFeedback:
    """Wraps `codec` for one tensor of `numel` values; `encode` is the only thing that changes state."""

    def __init__(self, codec: Codec, numel: int):
        self.codec = codec
        self.numel = numel
        self.name = codec.name
        self.residual = torch.zeros(numel, dtype=torch.float32)

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.codec!r}, numel={self.numel})"

    def encode(self, x: torch.Tensor) -> bytes:
        if check_input(x) != self.numel:
            raise CodecError(f"error feedback holds {self.numel} values, got {x.numel()}")
        corrected = x.detach() + self.residual
        data = self.codec.encode(corrected)
        self.residual = corrected.sub_(self.codec.decode(data, self.numel))
        return data

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        """Decoding is stateless: the same as the wrapped codec's."""
        return self.codec.decode(data, numel)

    def max_encoded_size(self, numel: int) -> int:
        return self.codec.max_encoded_size(numel)

    def reset(self) -> None:
        """Forget the residual (e.g. after the tensor's shape or owner changed)."""
        self.residual = torch.zeros(self.numel, dtype=torch.float32)

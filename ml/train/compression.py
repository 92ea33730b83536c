"""One worker's compression of its contributions to an averaging round: a codec from `ml.codecs`
applied to the flattened tensors, with error feedback (residual memory) for biased codecs.

The residual is part of the worker's training state: `state_dict()`/`load_state_dict()` carry it
through checkpoints so a replayed segment compresses exactly as the original did.
"""
from __future__ import annotations

import torch

from ml.codecs import ErrorFeedback, get_codec

BIASED_CODECS = frozenset({"topk", "sign"})   # need error feedback to converge
DENSE_CODECS = frozenset({"fp32", "fp16", "bf16", "int8", "int4"})


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """All tensors as one contiguous float32 vector (in order)."""
    if not tensors:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Split `flat` back into tensors shaped like `like`."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()].view_as(t).clone())
        offset += t.numel()
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} values, shapes need {offset}")
    return out


class Compressor:
    """Encodes a worker's flat contribution with `codec`, feeding back what the codec lost."""

    def __init__(self, codec: str = "fp32", options: dict | None = None,
                 error_feedback: bool | None = None):
        self.codec_name = codec.partition("+")[0]
        self.codec = get_codec(codec, **(options or {}))
        self.error_feedback = self.codec_name in BIASED_CODECS if error_feedback is None else error_feedback
        self._feedback: ErrorFeedback | None = None

    @property
    def dense(self) -> bool:
        """Whether the codec keeps every coordinate (so a sum of decodings can be re-encoded)."""
        return self.codec_name in DENSE_CODECS

    def encode(self, flat: torch.Tensor) -> bytes:
        if not self.error_feedback:
            return self.codec.encode(flat.contiguous())
        if self._feedback is None or self._feedback.numel != flat.numel():
            self._feedback = ErrorFeedback(self.codec, flat.numel())
        return self._feedback.encode(flat.contiguous())

    def decode(self, data: bytes, numel: int) -> torch.Tensor:
        return self.codec.decode(data, numel)

    @property
    def residual(self) -> torch.Tensor | None:
        return None if self._feedback is None else self._feedback.residual

    def state_dict(self) -> dict:
        return {"residual": self.residual}

    def load_state_dict(self, state: dict) -> None:
        residual = state["residual"]
        if residual is None:
            self._feedback = None
            return
        self._feedback = ErrorFeedback(self.codec, residual.numel())
        self._feedback.residual = residual.clone()

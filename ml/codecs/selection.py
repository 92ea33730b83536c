"""Per-tensor codec choice by size and role: biases and norms stay fp32, small tensors go fp16,
embeddings (sparse gradients) get lz4 framing, everything else uses the job's preferred codec."""
from __future__ import annotations

from ml.names import powersgd_rank

from .base import codec_names
from .powersgd import DEFAULT_MIN_COMPRESSION, matrix_shape, worthwhile

ROLES = ("weight", "bias", "norm", "embedding", "other")
LOSSLESS_OR_HALF = ("fp32", "fp16", "bf16")
SMALL_NUMEL = 4096  # below this a lossy codec saves under ~10 KB and its error is not worth it


def choose_codec(
    numel: int,
    role: str,
    preferred: str,
    shape: tuple[int, ...] | None = None,
    min_compression: float = DEFAULT_MIN_COMPRESSION,
) -> str:
    """Codec name for one tensor: a `get_codec` name, or `preferred` itself when it is "powersgd<r>"
    and the tensor (viewed with `matrix_shape(shape)`; 1-D if shape is None) passes the gate."""
    if role not in ROLES:
        raise ValueError(f"unknown tensor role {role!r}; known: {ROLES}")
    rank = powersgd_rank(preferred)
    if rank is None and preferred.partition("+")[0] not in codec_names():
        raise ValueError(f"unknown codec {preferred!r}")
    if role in ("bias", "norm"):
        return "fp32"
    if rank is None and preferred in LOSSLESS_OR_HALF:
        return preferred + "+lz4" if role == "embedding" else preferred
    if numel < SMALL_NUMEL:
        return "fp16"
    if rank is not None:
        fits = worthwhile(matrix_shape(shape if shape is not None else (numel,)), rank, min_compression)
        return preferred if fits else "fp16"
    return preferred

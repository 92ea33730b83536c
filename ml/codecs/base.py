"""The codec interface every gradient codec implements, its wire header, errors and registry.

A codec turns a 1-D contiguous float32 CPU tensor into self-describing bytes and back. Every
encoding starts with an 8-byte header (codec id, flags, a 16-bit parameter such as the block
size, numel) so a decoder can reject data meant for another codec or another tensor. Decoding is
strict: anything malformed, truncated, oversized or of the wrong length raises `CodecError`, and a
valid encoding never decodes to NaN/Inf. Encoding rejects non-finite input with `CodecError`
(see docs/adr/0030). Encodings are deterministic: the same input gives the same bytes.

Stateful helpers built on this interface live next to it and are exported from `ml.codecs`:
`ErrorFeedback` (residual memory around a lossy codec), `PowerSGD` (two-phase low-rank
compression), `choose_codec` (per-tensor choice by size and role).
"""
from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np
import torch

HEADER = struct.Struct("<BBHI")  # codec id, flags, 16-bit parameter, numel
HEADER_SIZE = HEADER.size
MAX_NUMEL = 2**32 - 1


class CodecError(ValueError):
    """Bad codec input: non-finite or wrongly typed tensor, malformed or mismatched encoding."""


@runtime_checkable
class Codec(Protocol):
    """A stateless tensor codec. `name` is the registry name, e.g. "fp16", "int8", "topk"."""

    name: str

    def encode(self, x: torch.Tensor) -> bytes:
        """Encode a 1-D contiguous float32 CPU tensor of finite values."""
        ...

    def decode(self, data: bytes | memoryview, numel: int) -> torch.Tensor:
        """Decode to a new float32 tensor of `numel` values; CodecError on any mismatch."""
        ...

    def max_encoded_size(self, numel: int) -> int:
        """Upper bound on len(encode(x)) for x.numel() == numel (receivers cap messages with it)."""
        ...


# Codec ids on the wire; one byte, never reused.
CODEC_IDS: dict[str, int] = {
    "fp32": 1,
    "fp16": 2,
    "bf16": 3,
    "int8": 4,
    "int4": 5,
    "topk": 6,
    "sign": 7,
    "lz4": 8,
}

_FACTORIES: dict[str, Callable[..., Codec]] = {}


def register_codec(name: str, factory: Callable[..., Codec]) -> None:
    """Make `get_codec(name, **opts)` build codecs with `factory(**opts)`."""
    if name not in CODEC_IDS:
        raise ValueError(f"codec {name!r} has no wire id")
    _FACTORIES[name] = factory


def codec_names() -> list[str]:
    """Names `get_codec` accepts (each may also take a "+lz4" suffix)."""
    return sorted(n for n in _FACTORIES if n != "lz4")


def get_codec(name: str, **opts) -> Codec:
    """Build the codec called `name` ("fp32", "fp16", "bf16", "int8", "int4", "topk", "sign").

    A "+lz4" suffix (e.g. "fp16+lz4") wraps the codec in lossless lz4 framing that compresses only
    where it pays. `opts` go to the codec (e.g. block=128 for int8, ratio=0.01 for topk).
    """
    base, _, suffix = name.partition("+")
    if suffix not in ("", "lz4"):
        raise CodecError(f"unknown codec suffix in {name!r}")
    factory = _FACTORIES.get(base)
    if factory is None or base == "lz4":
        raise CodecError(f"unknown codec {name!r}; known: {codec_names()}")
    codec = factory(**opts)
    if suffix == "lz4":
        codec = _FACTORIES["lz4"](inner=codec)
    return codec


def check_input(x: torch.Tensor) -> int:
    """Validate an encode input (1-D contiguous float32 CPU tensor) and return its numel."""
    if not isinstance(x, torch.Tensor):
        raise CodecError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32 or x.dim() != 1 or x.device.type != "cpu" or not x.is_contiguous():
        raise CodecError(
            f"expected a 1-D contiguous float32 CPU tensor, got {x.dtype} shape {tuple(x.shape)} on {x.device}"
        )
    numel = x.numel()
    if numel > MAX_NUMEL:
        raise CodecError(f"tensor of {numel} values is too large for one encoding (max {MAX_NUMEL})")
    return numel


def all_finite(x: torch.Tensor) -> bool:
    """True if x holds no NaN/Inf (one min/max pass: NaN propagates, Inf shows as an extreme)."""
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def require_finite(x: torch.Tensor) -> None:
    """Raise CodecError if x holds NaN or Inf."""
    if not all_finite(x):
        raise CodecError("tensor contains NaN or Inf")


_TORCH_GRAIN = 32768  # torch runs element-wise ops on fewer values than this on the calling thread


def chunk_values() -> int:
    """Values per step for the codecs' chunked loops: cache-sized when torch is single-threaded, and
    well below torch's parallel grain otherwise, so no step opens a parallel region (one per small op
    costs more than it saves, and on a busy host each can stall for a scheduler tick: we measured
    2.4 s instead of 0.27 s for int8 on 25M values with 2 threads and 64k-value steps)."""
    return 1 << 16 if torch.get_num_threads() == 1 else _TORCH_GRAIN // 2


def pack_header(codec_id: int, flags: int, param: int, numel: int) -> bytes:
    return HEADER.pack(codec_id, flags, param, numel)


def read_header(data: bytes | memoryview, codec_id: int, numel: int) -> tuple[int, int]:
    """Check the header of `data` against the expected codec and numel; return (flags, param)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if not 0 <= numel <= MAX_NUMEL:
        raise CodecError(f"numel {numel} out of range")
    if len(data) < HEADER_SIZE:
        raise CodecError(f"encoding of {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
    got_id, flags, param, got_numel = HEADER.unpack_from(data, 0)
    if got_id != codec_id:
        raise CodecError(f"codec id {got_id} in header, expected {codec_id}")
    if got_numel != numel:
        raise CodecError(f"header says {got_numel} values, expected {numel}")
    return flags, param


def require_length(data: bytes | memoryview, expected: int) -> None:
    if len(data) != expected:
        raise CodecError(f"encoding is {len(data)} bytes, expected {expected}")


_readonly_warning_silenced = False


def view_array(data: bytes | memoryview, dtype: np.dtype, offset: int, count: int) -> torch.Tensor:
    """Zero-copy tensor over `count` items of `dtype` at byte `offset` of `data`.

    The caller must have checked the length; the result must never be written to or returned.
    """
    global _readonly_warning_silenced
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if arr.flags.writeable or _readonly_warning_silenced:
        return torch.from_numpy(arr)
    # torch warns once per process that a view of read-only memory is unsafe to write; we never write.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        view = torch.from_numpy(arr)
    _readonly_warning_silenced = True
    return view


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a CPU tensor (made contiguous), for b"".join to copy once."""
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().data

"""Frames of the serving protocol: a JSON header plus tensors, hidden states as f32, f16, int8 or int4.

A frame is a 4-byte big-endian body length, then the body: a 4-byte header length, the UTF-8 JSON
header (an object), and the tensors' bytes back to back. The header's "tensors" list describes each
one: {"name", "codec", "shape", "nbytes"}. Codecs:

- "f32": little-endian float32, bit-exact.
- "f16": little-endian float16 (values outside fp16's range are refused, not turned into inf).
- "int8", "int4": the all-reduce's blockwise quantizers (ml/codecs/blockwise.py) with blocks of
  `BLOCK` values and exact f32 scales (absmax / levels, so that decoding and re-encoding gives the
  same tensor: a pushed input is checked by that digest), their encoding verbatim: the codec's
  8-byte header, one f32 scale per block, then the codes (int4: two per byte); error per value
  <= scale / 2. One quantizer family and one set of names for training and serving (ADR 0190).

Everything is bounded and checked before use (frame and header size, names, dims, element counts,
exact byte counts, finite values); anything else raises WireError. Pure functions only: the stream
drivers are in ml/serve/protocol.py.
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ml.codecs import CodecError, get_codec

CODECS = ("f32", "f16", "int8", "int4")
BLOCK = 64
QUANTIZERS = {name: get_codec(name, block=BLOCK, scale="f32") for name in ("int8", "int4")}
MAX_FRAME = 64 << 20
MAX_HEADER = 64 << 10
MAX_TENSORS = 64
MAX_DIMS = 4
MAX_ELEMENTS = 16 << 20
LENGTH = struct.Struct(">I")
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
F16_MAX = 65504.0


class WireError(ValueError):
    """A frame or tensor that is malformed, oversized, non-finite or not encodable in its codec."""


@dataclass
class Message:
    header: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    nbytes: int = 0   # the frame's size on the wire


def encoded_size(codec: str, elements: int) -> int:
    if codec == "f32":
        return 4 * elements
    if codec == "f16":
        return 2 * elements
    if codec in QUANTIZERS:
        return QUANTIZERS[codec].max_encoded_size(elements)
    raise WireError(f"unknown codec {codec!r}; known: {list(CODECS)}")


def encode_tensor(tensor: torch.Tensor, codec: str) -> bytes:
    """The bytes of `tensor` (any float dtype, converted to float32 first) in `codec`."""
    values = tensor.detach().to(torch.float32).contiguous().numpy().reshape(-1)
    if not np.isfinite(values).all():
        raise WireError("tensor has non-finite values")
    if codec == "f32":
        return values.astype("<f4").tobytes()
    if codec == "f16":
        if values.size and float(np.abs(values).max()) > F16_MAX:
            raise WireError("tensor exceeds the fp16 range; use f32 or int8")
        return values.astype("<f2").tobytes()
    if codec in QUANTIZERS:
        try:
            return QUANTIZERS[codec].encode(torch.from_numpy(values))
        except CodecError as exc:
            raise WireError(f"{codec}: {exc}") from None
    raise WireError(f"unknown codec {codec!r}; known: {list(CODECS)}")


def decode_tensor(data: bytes | memoryview, codec: str, shape: tuple[int, ...]) -> torch.Tensor:
    elements = math.prod(shape)
    if len(data) != encoded_size(codec, elements):
        raise WireError(f"{codec} tensor of shape {list(shape)} needs {encoded_size(codec, elements)} bytes, "
                        f"got {len(data)}")
    if codec == "f32":
        values = np.frombuffer(data, dtype="<f4").astype(np.float32)
    elif codec == "f16":
        values = np.frombuffer(data, dtype="<f2").astype(np.float32)
    else:
        try:
            values = QUANTIZERS[codec].decode(data, elements).numpy()
        except CodecError as exc:
            raise WireError(f"{codec}: {exc}") from None
    if not np.isfinite(values).all():
        raise WireError("tensor has non-finite values")
    return torch.from_numpy(values.reshape(shape).copy())


def roundtrip(tensor: torch.Tensor, codec: str) -> torch.Tensor:
    """`tensor` as the other side decodes it (bit-identical for "f32")."""
    return decode_tensor(encode_tensor(tensor, codec), codec, tuple(tensor.shape))


def encode_frame(header: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None, codec: str = "f32") -> bytes:
    """One frame: `header` (without "tensors") plus `tensors`, all in `codec`."""
    tensors = tensors or {}
    if len(tensors) > MAX_TENSORS:
        raise WireError(f"{len(tensors)} tensors exceed {MAX_TENSORS}")
    metas, blobs = [], []
    for name, tensor in tensors.items():
        if not NAME.match(name) or tensor.dim() > MAX_DIMS or tensor.numel() > MAX_ELEMENTS:
            raise WireError(f"tensor {name!r} of shape {list(tensor.shape)} cannot be sent")
        blob = encode_tensor(tensor, codec)
        metas.append({"name": name, "codec": codec, "shape": list(tensor.shape), "nbytes": len(blob)})
        blobs.append(blob)
    head = json.dumps({**header, "tensors": metas}, separators=(",", ":"), allow_nan=False).encode()
    if len(head) > MAX_HEADER:
        raise WireError(f"header of {len(head)} bytes exceeds {MAX_HEADER}")
    body_length = LENGTH.size + len(head) + sum(map(len, blobs))
    if body_length > MAX_FRAME:
        raise WireError(f"frame of {body_length} bytes exceeds {MAX_FRAME}")
    return b"".join([LENGTH.pack(body_length), LENGTH.pack(len(head)), head, *blobs])


def frame_length(prefix: bytes) -> int:
    """The body length announced by a frame's 4-byte prefix (checked against MAX_FRAME)."""
    length: int = LENGTH.unpack(prefix)[0]
    if length > MAX_FRAME:
        raise WireError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    if length < LENGTH.size:
        raise WireError("frame too short")
    return length


def _check_meta(meta: object, seen: set[str]) -> tuple[str, str, tuple[int, ...], int]:
    if not isinstance(meta, dict):
        raise WireError("a tensor description is not an object")
    name, codec, shape, nbytes = meta.get("name"), meta.get("codec"), meta.get("shape"), meta.get("nbytes")
    if not isinstance(name, str) or not NAME.match(name) or name in seen:
        raise WireError(f"bad or repeated tensor name {str(name)[:40]!r}")
    if codec not in CODECS:
        raise WireError(f"unknown codec {str(codec)[:20]!r}; known: {list(CODECS)}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_ELEMENTS for d in shape)):
        raise WireError(f"tensor {name}: shape must be a list of at most {MAX_DIMS} sizes")
    elements = math.prod(shape)
    if elements > MAX_ELEMENTS:
        raise WireError(f"tensor {name}: {elements} elements exceed {MAX_ELEMENTS}")
    if nbytes != encoded_size(codec, elements):
        raise WireError(f"tensor {name}: nbytes {str(nbytes)[:20]} != {encoded_size(codec, elements)}")
    return name, codec, tuple(shape), nbytes


def decode_frame(body: bytes) -> Message:
    """A frame body (after the 4-byte prefix) as a Message; WireError if anything is off."""
    if len(body) < LENGTH.size:
        raise WireError("frame too short")
    (head_length,) = LENGTH.unpack_from(body)
    if head_length > MAX_HEADER or LENGTH.size + head_length > len(body):
        raise WireError(f"header length {head_length} is out of bounds")
    try:
        header = json.loads(body[LENGTH.size:LENGTH.size + head_length])
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise WireError("header is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    metas = header.pop("tensors", [])
    if not isinstance(metas, list) or len(metas) > MAX_TENSORS:
        raise WireError(f"tensors must be a list of at most {MAX_TENSORS}")
    checked: list[Any] = []
    seen: set[str] = set()
    for meta in metas:
        name, codec, shape, nbytes = _check_meta(meta, seen)
        seen.add(name)
        checked.append((name, codec, shape, nbytes))
    view, offset = memoryview(body), LENGTH.size + head_length
    if offset + sum(c[3] for c in checked) != len(body):
        raise WireError("tensor bytes do not match the frame length")
    tensors = {}
    for name, codec, shape, nbytes in checked:
        tensors[name] = decode_tensor(view[offset:offset + nbytes], codec, shape)
        offset += nbytes
    return Message(header, tensors, LENGTH.size + len(body))

"""Chunk payloads of the all-reduce: encode without joining, decode into place, reduce with one check.

The hot path of a round is encode -> send -> decode -> sum. These helpers keep it to the passes it
needs (docs/perf/allreduce-cpu-per-round.md):
- fp32 parts and results go out as (codec header, byte view of the tensor) with no copy; the bytes
  on the wire are exactly `FloatCodec("fp32").encode`'s.
- results decode straight into their place in the output tensor.
- a reducer sums fp32 contributions from views of the received bytes (no decode copy) and checks
  finiteness once, on the sum: NaN/Inf in any term shows in the sum, so the terms are only
  inspected (to name the culprit) when the sum is not finite. Other codecs guarantee that a valid
  encoding decodes to finite values, so their decodes need no extra check either.
- local values are checked once per round (the group does it before the first attempt), not per chunk.
Sums run in the members' sorted order, so the bits equal the plain reference sum's.
"""
from __future__ import annotations

import numpy as np
import torch

from ml.codecs.base import (
    CODEC_IDS,
    HEADER_SIZE,
    Codec,
    CodecError,
    all_finite,
    pack_header,
    read_header,
    require_length,
    tensor_bytes,
    view_array,
)
from ml.codecs.float_codecs import FloatCodec

from .inbox import PeerFailure

Payload = bytes | memoryview | tuple
_FP32_ID = CODEC_IDS["fp32"]
_FP32_WIRE = np.dtype("<f4")


def is_fp32(codec: Codec) -> bool:
    """The lossless codec, whose payloads are used in place (a wrapped codec takes the general path)."""
    return isinstance(codec, FloatCodec) and codec.name == "fp32"


def encode_local(codec: Codec, values: torch.Tensor, me: str) -> Payload:
    """Encode finite local values (the group checked them); fp32 as a view, not a copy."""
    values = values.contiguous()
    if is_fp32(codec):
        return pack_header(_FP32_ID, 0, 0, values.numel()), tensor_bytes(values)
    try:
        return codec.encode(values)
    except CodecError as exc:
        raise PeerFailure(me, f"cannot encode local contribution: {exc}") from None


def encode_result(codec: Codec, mean: torch.Tensor) -> tuple[Payload, torch.Tensor]:
    """Encode a reduced mean (finite: made by `sum_in_order`) once; (payload, the values every
    member will decode from it). The fp32 payload is a view of `mean`: never modify it after."""
    if is_fp32(codec):
        return (pack_header(_FP32_ID, 0, 0, mean.numel()), tensor_bytes(mean)), mean  # lossless
    encoded = codec.encode(mean)  # CodecError if a finite sum overflowed
    return encoded, codec.decode(encoded, mean.numel())


def _fp32_view(payload: bytes, numel: int) -> torch.Tensor:
    read_header(payload, _FP32_ID, numel)
    require_length(payload, HEADER_SIZE + 4 * numel)
    return view_array(payload, _FP32_WIRE, HEADER_SIZE, numel)


def received_view(codec: Codec, payload: bytes, numel: int, sender: str, what: str) -> torch.Tensor:
    """Values of a received chunk, NOT checked for finiteness: for fp32 a read-only view of the
    payload (never write to it), else a fresh decoding (finite by the codec's guarantee)."""
    try:
        if is_fp32(codec):
            return _fp32_view(payload, numel)
        values = codec.decode(payload, numel)
    except (CodecError, ValueError, RuntimeError) as exc:
        raise PeerFailure(sender, f"malformed {what}: {exc}", bad_data=True) from None
    if values.numel() != numel:
        raise PeerFailure(sender, f"malformed {what}: {values.numel()} values, expected {numel}", bad_data=True)
    return values


def decode_into(codec: Codec, payload: bytes, out: torch.Tensor, sender: str, what: str) -> None:
    """Decode a received chunk into `out` (a contiguous float32 slice); PeerFailure naming the
    sender if it is malformed or not finite."""
    values = received_view(codec, payload, out.numel(), sender, what)
    out.copy_(values)
    if is_fp32(codec) and not all_finite(out):
        raise PeerFailure(sender, f"non-finite values (NaN/Inf) in {what}", bad_data=True)


def _term_values(codec: Codec, term: torch.Tensor | bytes, numel: int, member: str, what: str, *,
                 mine: bool) -> torch.Tensor:
    """One term of a sum as values: our own tensor as it is, a received payload decoded."""
    if mine:
        assert isinstance(term, torch.Tensor)
        return term
    assert not isinstance(term, torch.Tensor)
    return received_view(codec, term, numel, member, what)


def sum_in_order(codec: Codec, terms: list[tuple[str, torch.Tensor | bytes]], me: str, what: str,
                 numel: int) -> torch.Tensor:
    """The sum of `terms` ((member, finite local tensor or received payload), in summation order)
    as a new tensor. PeerFailure names a member whose term is malformed or not finite; an fp32
    sum of finite terms that overflows raises CodecError (a local failure; other codecs raise it
    when encoding the mean)."""
    views = [_term_values(codec, term, numel, member, what, mine=member == me) for member, term in terms]
    first, rest = views[0], views[1:]
    if not rest:
        acc = first.clone()
    elif is_fp32(codec) or terms[0][0] == me:  # a payload view or local values: never in place
        acc, rest = torch.add(first, rest[0]), rest[1:]
    else:
        acc = first  # a fresh decoding
    for values in rest:
        acc.add_(values)
    if is_fp32(codec) and not all_finite(acc):  # NaN/Inf in any term shows in the sum
        for (member, _), values in zip(terms, views):
            if not all_finite(values):
                raise PeerFailure(member, f"non-finite values (NaN/Inf) in {what}", bad_data=True)
        raise CodecError("the sum of finite contributions overflowed to Inf")
    return acc

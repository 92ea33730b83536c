"""Strict decoding under fuzzing: any bytes either decode to numel finite values or raise CodecError."""
import struct

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ml.codecs import CodecError, get_codec
from ml.codecs.base import CODEC_IDS

CODECS = [
    "fp32", "fp16", "bf16", "int8", "int4", "topk", "sign",
    "fp16+lz4", "int8+lz4", "topk+lz4",
]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode_or_codec_error(codec, data, numel):
    try:
        out = codec.decode(data, numel)
    except CodecError:
        return None
    assert out.dtype == torch.float32 and out.shape == (numel,)
    assert bool(torch.isfinite(out).all())
    return out


@FUZZ
@given(name=st.sampled_from(CODECS), data=st.binary(max_size=600), numel=st.integers(0, 400))
def test_random_bytes(name, data, numel):
    decode_or_codec_error(get_codec(name), data, numel)


@FUZZ
@given(name=st.sampled_from(CODECS), numel=st.integers(0, 400), body=st.binary(min_size=0, max_size=2000))
def test_valid_header_random_body_of_the_right_length(name, numel, body):
    """Gets past header and length checks, so it exercises the value checks (scales, codes, indices)."""
    codec = get_codec(name)
    template = codec.encode(torch.randn(numel))
    body = (body * (len(template) // max(1, len(body)) + 1))[: len(template) - 8] if body else bytes(len(template) - 8)
    decode_or_codec_error(codec, template[:8] + body, numel)


@FUZZ
@given(
    name=st.sampled_from(CODECS),
    numel=st.integers(1, 400),
    seed=st.integers(0, 2**31),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_mutated_valid_encodings(name, numel, seed, edits):
    codec = get_codec(name)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed)) * 10 ** (seed % 20 - 10)
    data = bytearray(codec.encode(x))
    for pos, value in edits:
        data[pos % len(data)] = value
    decode_or_codec_error(codec, bytes(data), numel)


@FUZZ
@given(numel=st.integers(1, 3000), count=st.integers(0, 2**32 - 1), body=st.binary(max_size=64))
def test_topk_forged_counts(numel, count, body):
    header = struct.pack("<BBHI", CODEC_IDS["topk"], 0, 0, numel) + count.to_bytes(4, "little")
    decode_or_codec_error(get_codec("topk"), header + body, numel)


def test_lz4_forged_inner_length_cannot_allocate_beyond_the_bound():
    codec = get_codec("fp16+lz4")
    header = struct.pack("<BBHI", CODEC_IDS["lz4"], 1, CODEC_IDS["fp16"], 10) + (2**31).to_bytes(4, "little")
    try:
        codec.decode(header + b"\x00" * 16, 10)
    except CodecError as exc:
        assert "exceeds" in str(exc)
    else:
        raise AssertionError("forged inner length accepted")

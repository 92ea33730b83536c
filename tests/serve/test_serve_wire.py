"""Serving frames: exact fp32 round trips, bounded fp16/int8 error, and refusal of malformed frames."""
import json
import struct

import pytest
import torch

from ml.serve import wire
from ml.serve.wire import WireError, decode_frame, decode_tensor, encode_frame, encode_tensor, frame_length


def roundtrip(tensors, codec):
    frame = encode_frame({"type": "x", "n": 1}, tensors, codec)
    assert frame_length(frame[:4]) == len(frame) - 4
    return decode_frame(frame[4:])


def test_f32_is_bit_exact_and_header_survives():
    t = torch.randn(2, 7, 33)
    msg = roundtrip({"h": t, "g": torch.zeros(0, 3)}, "f32")
    assert msg.header == {"type": "x", "n": 1} and torch.equal(msg.tensors["h"], t)
    assert msg.tensors["g"].shape == (0, 3)


@pytest.mark.parametrize("codec,size_ratio", [("f16", 0.5), ("i8", 0.27), ("i4", 0.141)])
def test_lossy_codecs_are_smaller_and_bounded(codec, size_ratio):
    t = torch.randn(1, 50, 768) * 3
    got = roundtrip({"h": t}, codec).tensors["h"]
    assert len(encode_tensor(t, codec)) <= size_ratio * 4 * t.numel()
    blocks = t.reshape(-1)
    if codec in ("i8", "i4"):   # error at most half a quantisation step of each 64-value block
        pad = (-blocks.numel()) % wire.INT8_BLOCK
        levels = 127 if codec == "i8" else 7
        scales = torch.nn.functional.pad(blocks.abs(), (0, pad)).reshape(-1, wire.INT8_BLOCK).amax(1) / levels
        bound = scales.repeat_interleave(wire.INT8_BLOCK)[:blocks.numel()] / 2 + 1e-6
        assert bool(((got.reshape(-1) - blocks).abs() <= bound).all())
    else:
        assert float((got - t).abs().max()) <= 3e-3 * float(t.abs().max())


@pytest.mark.parametrize("size", [1, 63, 64, 65, 129])
def test_quantised_codecs_round_trip_odd_sizes_and_zero_blocks(size):
    t = torch.cat([torch.zeros(64), torch.linspace(-3, 3, size)])
    for codec in ("i8", "i4"):
        got = roundtrip({"h": t}, codec).tensors["h"]
        assert torch.equal(got[:64], torch.zeros(64)) and float((got - t).abs().max()) <= 3 / 7 / 2 + 1e-6


def test_bad_int4_code_is_refused():
    frame = body({"tensors": [{"name": "h", "codec": "i4", "shape": [2], "nbytes": 5}]},
                 struct.pack("<f", 1.0) + bytes([0x80]))    # low nibble 0 -> code -8
    with pytest.raises(WireError, match="-7..7"):
        decode_frame(frame)


def test_unencodable_tensors_are_refused():
    with pytest.raises(WireError, match="non-finite"):
        encode_tensor(torch.tensor([1.0, float("nan")]), "f32")
    with pytest.raises(WireError, match="fp16"):
        encode_tensor(torch.tensor([1e6]), "f16")
    with pytest.raises(WireError, match="codec"):
        encode_tensor(torch.zeros(3), "f8")


def body(header: dict, payload: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack(">I", len(head)) + head + payload


@pytest.mark.parametrize("frame,match", [
    (b"\x00\x00", "too short"),
    (body({"type": "x"})[:6], "out of bounds"),
    (struct.pack(">I", 3) + b"\xff\xfe\x00", "not JSON"),
    (body([1, 2]), "not a JSON object"),
    (body({"tensors": "no"}), "list"),
    (body({"tensors": [{"name": "H!", "codec": "f32", "shape": [1], "nbytes": 4}]}, b"\0" * 4), "name"),
    (body({"tensors": [{"name": "h", "codec": "f32", "shape": [1], "nbytes": 4}] * 2}, b"\0" * 8), "repeated"),
    (body({"tensors": [{"name": "h", "codec": "f32", "shape": [1, 1, 1, 1, 1], "nbytes": 4}]}, b"\0" * 4), "shape"),
    (body({"tensors": [{"name": "h", "codec": "f32", "shape": [1 << 20, 1 << 20], "nbytes": 4}]}), "exceed"),
    (body({"tensors": [{"name": "h", "codec": "f32", "shape": [2], "nbytes": 4}]}, b"\0" * 4), "nbytes"),
    (body({"tensors": [{"name": "h", "codec": "f32", "shape": [1], "nbytes": 4}]}, b"\0" * 5), "do not match"),
    (body({"tensors": [{"name": "h", "codec": "f32", "shape": [1], "nbytes": 4}]}, struct.pack("<f", float("inf"))),
     "non-finite"),
    (body({"tensors": [{"name": "h", "codec": "i8", "shape": [2], "nbytes": 6}]}, struct.pack("<f", -1.0) + b"\1\1"),
     "scales"),
    (body({"tensors": [{"name": "h", "codec": "f32", "shape": [True], "nbytes": 4}]}, b"\0" * 4), "shape"),
])
def test_malformed_frames_are_refused(frame, match):
    with pytest.raises(WireError, match=match):
        decode_frame(frame)


def test_oversized_frames_are_refused_from_the_prefix():
    with pytest.raises(WireError, match="exceeds"):
        frame_length(struct.pack(">I", wire.MAX_FRAME + 1))
    with pytest.raises(WireError, match="exceeds"):
        encode_frame({"pad": "x" * wire.MAX_HEADER})


def test_decode_tensor_checks_length():
    with pytest.raises(WireError, match="needs"):
        decode_tensor(b"\0" * 3, "f16", (2,))

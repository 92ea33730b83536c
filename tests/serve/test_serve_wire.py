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


@pytest.mark.parametrize("codec,size_ratio", [("f16", 0.5), ("int8", 0.27), ("int4", 0.141)])
def test_lossy_codecs_are_smaller_and_bounded(codec, size_ratio):
    t = torch.randn(1, 50, 768) * 3
    got = roundtrip({"h": t}, codec).tensors["h"]
    assert len(encode_tensor(t, codec)) <= size_ratio * 4 * t.numel()
    blocks = t.reshape(-1)
    if codec in ("int8", "int4"):   # error at most half a quantisation step of each block
        block = wire.QUANTIZERS[codec].block
        pad = (-blocks.numel()) % block
        levels = 127 if codec == "int8" else 7
        scales = torch.nn.functional.pad(blocks.abs(), (0, pad)).reshape(-1, block).amax(1) / levels
        bound = scales.repeat_interleave(block)[:blocks.numel()] / 2 + 1e-6
        assert bool(((got.reshape(-1) - blocks).abs() <= bound).all())
    else:
        assert float((got - t).abs().max()) <= 3e-3 * float(t.abs().max())


@pytest.mark.parametrize("size", [1, 63, 64, 65, 129])
def test_quantised_codecs_round_trip_odd_sizes_and_zero_blocks(size):
    t = torch.cat([torch.zeros(64), torch.linspace(-3, 3, size)])
    for codec in ("int8", "int4"):
        got = roundtrip({"h": t}, codec).tensors["h"]
        assert torch.equal(got[:64], torch.zeros(64))
        assert float((got - t).abs().max()) <= 3 / 7 / 2 + 1e-6


def test_serving_and_all_reduce_share_one_quantizer():
    """The wire carries ml.codecs' blockwise encoding (f32 scales, 64-value blocks) verbatim."""
    from ml.codecs import get_codec
    t = torch.linspace(-2, 2, 300)
    for codec in ("int8", "int4"):
        quantizer = get_codec(codec, block=wire.BLOCK, scale="f32")
        encoded = quantizer.encode(t)
        assert encode_tensor(t, codec) == encoded
        assert torch.equal(decode_tensor(encoded, codec, (300,)), quantizer.decode(encoded, 300))
        bf16_scales = get_codec(codec, block=wire.BLOCK).encode(t)   # the all-reduce's scales: another format
        with pytest.raises(WireError, match="flags"):
            decode_tensor(bf16_scales + bytes(len(encoded) - len(bf16_scales)), codec, (300,))


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_quantised_round_trip_is_idempotent(codec):
    """A pushed input is checked by the digest of its re-encoding: decoding then encoding again
    must give the same tensor, bit for bit, at every magnitude."""
    gen = torch.Generator().manual_seed(7)
    for exponent in range(-30, 31, 3):
        t = torch.randn(3, 200, generator=gen) * 10.0 ** exponent
        once = wire.roundtrip(t, codec)
        assert torch.equal(wire.roundtrip(once, codec), once)


def test_bad_int4_code_is_refused():
    good = encode_tensor(torch.tensor([1.0, -1.0]), "int4")
    frame = body({"tensors": [{"name": "h", "codec": "int4", "shape": [2], "nbytes": len(good)}]},
                 good[:-1] + bytes([good[-1] & 0xF0]))    # low nibble 0 -> code -8
    with pytest.raises(WireError, match="nibble 0"):
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
    (body({"tensors": [{"name": "h", "codec": "int8", "shape": [2], "nbytes": 14}]},
          struct.pack("<BBHI", 4, 1, 64, 2) + struct.pack("<f", -1.0) + b"\1\1"), "scale"),
    (body({"tensors": [{"name": "h", "codec": "int8", "shape": [2], "nbytes": 14}]},
          struct.pack("<BBHI", 4, 1, 64, 2) + struct.pack("<f", float("nan")) + b"\1\1"), "scale"),
    (body({"tensors": [{"name": "h", "codec": "int8", "shape": [2], "nbytes": 14}]},
          struct.pack("<BBHI", 4, 1, 128, 2) + struct.pack("<f", 1.0) + b"\1\1"), "block size"),
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

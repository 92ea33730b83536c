"""Varint and protobuf wire helpers: round trips, strictness, limits."""
import pytest

from node.p2p.protobuf import ProtobufError, bytes_fields, decode_fields, field_bytes, field_varint, single_bytes_field
from node.p2p.varint import VarintError, decode_uvarint, decode_uvarint_complete, encode_uvarint


@pytest.mark.parametrize("value,encoded", [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"),
                                           (255, b"\xff\x01"), (300, b"\xac\x02"), (16384, b"\x80\x80\x01")])
def test_varint_known_encodings(value, encoded):
    assert encode_uvarint(value) == encoded
    assert decode_uvarint(encoded) == (value, len(encoded))


def test_varint_round_trip_at_offsets():
    values = [0, 1, 2**7, 2**14 - 1, 2**35 + 5, 2**63 - 1]
    blob = b"".join(encode_uvarint(v) for v in values)
    pos, out = 0, []
    while pos < len(blob):
        v, pos = decode_uvarint(blob, pos)
        out.append(v)
    assert out == values


def test_varint_incomplete_returns_none_and_complete_raises():
    assert decode_uvarint(b"\x80\x80") is None
    with pytest.raises(VarintError):
        decode_uvarint_complete(b"\x80")


def test_varint_rejects_non_minimal_and_overlong():
    with pytest.raises(VarintError):
        decode_uvarint(b"\x80\x00")
    with pytest.raises(VarintError):
        decode_uvarint(b"\xff" * 9 + b"\x01")
    with pytest.raises(ValueError):
        encode_uvarint(-1)
    with pytest.raises(ValueError):
        encode_uvarint(2**63)


def test_protobuf_round_trip_and_repeated_fields():
    msg = field_bytes(1, b"key") + field_varint(2, 300) + field_bytes(3, b"a") + field_bytes(3, b"b")
    fields = decode_fields(msg)
    assert fields == [(1, 2, b"key"), (2, 0, 300), (3, 2, b"a"), (3, 2, b"b")]
    assert bytes_fields(fields, 3) == [b"a", b"b"]
    assert single_bytes_field(fields, 1) == b"key"
    assert single_bytes_field(fields, 9) is None


def test_protobuf_skips_fixed_fields_and_rejects_bad_input():
    fixed = bytes([(4 << 3) | 1]) + b"\x01" * 8 + bytes([(5 << 3) | 5]) + b"\x02" * 4
    assert [f[0] for f in decode_fields(fixed)] == [4, 5]
    for bad in [b"\x0a\x05abc", b"\x0b", b"\x00\x01", b"\x08", b"\x09\x01\x02"]:
        with pytest.raises(ProtobufError):
            decode_fields(bad)
    with pytest.raises(ProtobufError):
        bytes_fields(decode_fields(field_varint(1, 5)), 1)

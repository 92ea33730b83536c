"""Canonical encoding: round trips, one encoding per value, strict rejection of the rest."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.encoding import MAX_DEPTH, EncodingError, decode, encode

values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**256) + 1, max_value=2**256 - 1)
    | st.binary(max_size=64) | st.text(max_size=32),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(values)
def test_round_trip_and_reencode_is_identical(value):
    raw = encode(value)
    assert decode(raw) == value
    assert encode(decode(raw)) == raw


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_junk_either_decodes_canonically_or_raises_encoding_error(junk):
    try:
        value = decode(junk)
    except EncodingError:
        return
    assert encode(value) == junk  # anything accepted is the one canonical encoding


@settings(max_examples=100, deadline=None)
@given(values, st.binary(min_size=1, max_size=4))
def test_trailing_bytes_rejected(value, extra):
    with pytest.raises(EncodingError, match="trailing"):
        decode(encode(value) + extra)


def test_dict_key_order_does_not_change_encoding():
    assert encode({"b": 1, "a": 2}) == encode({"a": 2, "b": 1})


def test_known_vectors():
    assert encode(None) == b"\x00"
    assert encode(True) == b"\x02"
    assert encode(0) == b"\x03\x00"
    assert encode(300) == b"\x03\xac\x02"
    assert encode(-1) == b"\x04\x00"
    assert encode(b"ab") == b"\x05\x02ab"
    assert encode("é") == b"\x06\x02\xc3\xa9"
    assert encode([1, "a"]) == b"\x07\x02\x03\x01\x06\x01a"
    assert encode({"a": 1}) == b"\x08\x01\x01a\x03\x01"


@pytest.mark.parametrize("raw, why", [
    (b"\x03\x80\x00", "non-minimal"),           # 0 written in two bytes
    (b"\x03\xac\x82\x00", "non-minimal"),
    (b"\x08\x02\x01b\x00\x01a\x00", "sorted"),  # keys out of order
    (b"\x08\x02\x01a\x00\x01a\x00", "sorted"),  # duplicate key
    (b"\x09", "unknown tag"),
    (b"\x05\x05ab", "past the end"),
    (b"\x06\x01\xff", "utf-8"),
    (b"\x07\x05\x00", "count"),
    (b"\x07\x02\x00", "count"),
    (b"\x03\x80", "truncated"),
    (b"\x08\x01\x01a", "truncated"),
    (b"", "truncated"),
])
def test_rejects_non_canonical_and_malformed(raw, why):
    with pytest.raises(EncodingError, match=why):
        decode(raw)


def test_limits():
    with pytest.raises(EncodingError, match="exceeds the limit"):
        decode(encode(b"x" * 100), max_size=50)
    with pytest.raises(EncodingError, match="too large"):
        encode(2**256)
    with pytest.raises(EncodingError, match="too large"):
        decode(b"\x03" + b"\xff" * 37 + b"\x01")
    deep = b"\x07\x01" * (MAX_DEPTH + 1) + b"\x00"
    with pytest.raises(EncodingError, match="deeply"):
        decode(deep)
    with pytest.raises(EncodingError, match="cannot encode"):
        encode(1.5)
    with pytest.raises(EncodingError, match="keys must be str"):
        encode({1: 2})

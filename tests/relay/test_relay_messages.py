"""Circuit v2 codecs: round trips, byte-exact spec encodings, strict rejection of malformed input, fuzz."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.identity import Identity
from node.p2p.errors import ProtocolError
from node.p2p.multiaddr import Multiaddr
from node.p2p.protobuf import field_bytes
from relay.messages import (
    MAX_MESSAGE_BYTES,
    SESSION_FIELD,
    HopMessage,
    HopType,
    Limit,
    MessageReader,
    Peer,
    RelayMessageError,
    Reservation,
    Status,
    StopMessage,
    StopType,
    decode_hop,
    decode_stop,
    encode_hop,
    encode_stop,
    frame,
)

A = Identity.from_seed(b"a" * 32)
B = Identity.from_seed(b"b" * 32)
ADDR = Multiaddr.parse(f"/ip4/10.0.0.1/tcp/4001/p2p/{A.peer_id}")


def test_hop_round_trip_all_fields():
    msg = HopMessage(HopType.STATUS, peer=Peer(B.peer_id, (ADDR,)),
                     reservation=Reservation(1_800_000_000, (ADDR,), b"voucher"), limit=Limit(120, 1 << 17),
                     status=Status.OK, session=b"s" * 16)
    assert decode_hop(encode_hop(msg)) == msg


def test_stop_round_trip():
    msg = StopMessage(StopType.CONNECT, peer=Peer(A.peer_id), limit=Limit(data=5), session=b"x" * 16)
    assert decode_stop(encode_stop(msg)) == msg


def test_reserve_encoding_matches_spec_bytes():
    # HopMessage{type: RESERVE} is field 1 varint 0; CONNECT carries Peer{id} in field 2.
    assert encode_hop(HopMessage(HopType.RESERVE)) == b"\x08\x00"
    connect = encode_hop(HopMessage(HopType.CONNECT, peer=Peer(B.peer_id)))
    assert connect[:4] == b"\x08\x01\x12\x28" and connect[4:6] == b"\x0a\x26" and connect[6:] == B.peer_id_bytes
    assert encode_stop(StopMessage(StopType.STATUS, status=Status.OK)) == b"\x08\x01\x20\x64"


def test_unknown_fields_are_ignored():
    assert decode_hop(b"\x08\x00" + b"\xf8\x07\x05") == HopMessage(HopType.RESERVE)


@pytest.mark.parametrize("body, reason", [
    (b"", "without a type"),
    (b"\x08\x09", "unknown value"),
    (b"\x08\x02\x28\x07", "HopMessage.status: unknown value"),
    (b"\x0a\x00", "wire type"),
    (b"\x08\x01\x12\x03\x0a\x01\x00", "bad peer id"),
    (b"\x08\x01\x12\x00", "Peer without an id"),
    (b"\x08\x00\x1a\x00", "without an expiry"),
    (b"\x08\x00\x12", "malformed"),
    (b"\x08\x02" + field_bytes(SESSION_FIELD, b"abc"), "session of 3 bytes"),
])
def test_malformed_hop_rejected(body, reason):
    with pytest.raises(RelayMessageError, match=reason):
        decode_hop(body)


def test_too_many_addresses_rejected():
    peer_body = b"\x0a\x26" + A.peer_id_bytes + (b"\x12" + bytes([len(ADDR.to_bytes())]) + ADDR.to_bytes()) * 40
    with pytest.raises(RelayMessageError, match="addresses"):
        decode_hop(b"\x08\x01\x12" + bytes([len(peer_body) & 0x7F | 0x80, len(peer_body) >> 7]) + peer_body)


def test_unparseable_address_is_left_out():
    peer = b"\x0a\x26" + B.peer_id_bytes + b"\x12\x02\xff\x7f"
    msg = decode_hop(b"\x08\x01\x12" + bytes([len(peer)]) + peer)
    assert msg.peer == Peer(B.peer_id)


def test_reader_reassembles_and_keeps_rest():
    data = frame(encode_hop(HopMessage(HopType.RESERVE))) + b"tail"
    reader = MessageReader()
    assert reader.feed(data[:1]) is None
    assert reader.feed(data[1:]) == b"\x08\x00"
    assert reader.take_rest() == b"tail"


def test_reader_rejects_oversized_length_before_buffering():
    reader = MessageReader()
    with pytest.raises(RelayMessageError, match="exceeds"):
        reader.feed(b"\xff\xff\x01")
    with pytest.raises(ValueError):
        frame(b"x" * (MAX_MESSAGE_BYTES + 1))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_decoders_raise_only_protocol_errors(data):
    for decoder in (decode_hop, decode_stop):
        try:
            decoder(data)
        except ProtocolError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=8))
def test_fuzz_reader_never_crashes(chunks):
    reader = MessageReader()
    try:
        for chunk in chunks:
            reader.feed(chunk)
    except RelayMessageError:
        pass


@pytest.mark.parametrize("limit, limited", [
    (Limit(120, 128 << 10), True), (Limit(duration=120), True), (Limit(data=1), True),
    (Limit(24 * 3600, 1 << 40), False),  # py-libp2p interop relay: generous enough for bulk
    (Limit(), False), (None, False)])
def test_limit_field_present_or_absent_round_trips(limit, limited):
    from node.p2p.limited import is_limited

    hop = HopMessage(HopType.STATUS, limit=limit, status=Status.OK)
    stop = StopMessage(StopType.CONNECT, peer=Peer(A.peer_id), limit=limit)
    assert decode_hop(encode_hop(hop)).limit == limit
    assert decode_stop(encode_stop(stop)).limit == limit
    # a Limit with neither field caps nothing (spec: "unlimited")
    assert is_limited(limit) == limited


def test_js_default_limit_bytes():
    # js-libp2p's defaults as a go/js relay puts them on the wire: HopMessage field 4 {1: 120, 2: 131072}
    body = encode_hop(HopMessage(HopType.STATUS, limit=Limit(120, 131072), status=Status.OK))
    assert body == bytes([0x08, 0x02, 0x22, 0x06, 0x08, 0x78, 0x10, 0x80, 0x80, 0x08, 0x28, 0x64])
    assert decode_hop(body).limit == Limit(120, 131072)


@pytest.mark.parametrize("wire, seconds", [
    (120_000, 120),              # js-libp2p's 2-minute default, sent in milliseconds (issue 25)
    (3_600_000, 3600),           # a js relay configured for an hour
    (120, 120), (86_400, 86_400),  # spec-conformant seconds, up to a day, unchanged
    (90_000_001, 90_000_001)])   # not a whole number of milliseconds-seconds: left as seconds
def test_limit_duration_read_in_seconds_even_from_js_milliseconds(wire, seconds):
    from node.p2p.limited import is_limited

    body = encode_hop(HopMessage(HopType.STATUS, limit=Limit(wire), status=Status.OK))
    limit = decode_hop(body).limit
    assert limit is not None and limit.duration == seconds
    if wire == 120_000:  # js's default cap is a limited circuit, not a 33-hour one
        assert is_limited(limit)

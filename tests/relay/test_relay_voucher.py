"""Reservation vouchers: signed envelope layout, verification, and every way a voucher is refused."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.identity import Identity, b58decode
from node.p2p.protobuf import field_bytes, field_varint
from relay.voucher import DOMAIN, PAYLOAD_TYPE, VoucherError, decode_voucher, open_voucher, seal_voucher

RELAY = Identity.from_seed(b"r" * 32)
PEER = Identity.from_seed(b"p" * 32)
OTHER = Identity.from_seed(b"o" * 32)


def test_seal_and_open():
    envelope = seal_voucher(RELAY, PEER.peer_id, 2_000)
    record = open_voucher(envelope, RELAY.peer_id, PEER.peer_id, now=1_000)
    assert (record.relay, record.peer, record.expiration) == (RELAY.peer_id, PEER.peer_id, 2_000)
    assert PAYLOAD_TYPE == b"\x03\x02" and DOMAIN == b"libp2p-relay-rsvp"


def test_refusals():
    envelope = seal_voucher(RELAY, PEER.peer_id, 2_000)
    with pytest.raises(VoucherError, match="expired"):
        open_voucher(envelope, RELAY.peer_id, PEER.peer_id, now=2_000)
    with pytest.raises(VoucherError, match="another peer"):
        open_voucher(envelope, RELAY.peer_id, OTHER.peer_id, now=0)
    with pytest.raises(VoucherError, match="not signed by this relay"):
        open_voucher(seal_voucher(OTHER, PEER.peer_id, 2_000), RELAY.peer_id, PEER.peer_id, now=0)


def test_tampered_payload_fails_signature():
    envelope = bytearray(seal_voucher(RELAY, PEER.peer_id, 2_000))
    envelope[-70] ^= 1  # inside the payload's expiration/peer, before the 64-byte signature field
    record, signer, valid = decode_voucher(bytes(envelope))
    assert signer == RELAY.peer_id and not valid
    with pytest.raises(VoucherError):
        open_voucher(bytes(envelope), RELAY.peer_id, PEER.peer_id, now=0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decode_voucher(data):
    try:
        decode_voucher(data)
    except VoucherError:
        pass



def test_bad_peer_id_in_record_is_a_voucher_error():
    """Found by the fuzzer (devtools.fuzz voucher): a record whose peer is not an ed25519 peer id
    raised the base RelayMessageError, which the client's ``except VoucherError`` let through."""
    bad_peer = b"\x00\x24\x08\x02" + bytes(34)  # an identity multihash of a key that is not ed25519
    payload = field_bytes(1, b58decode(RELAY.peer_id)) + field_bytes(2, bad_peer) + field_varint(3, 2_000)
    envelope = (field_bytes(1, RELAY.public_key_protobuf) + field_bytes(2, PAYLOAD_TYPE) + field_bytes(3, payload)
                + field_bytes(5, bytes(64)))
    with pytest.raises(VoucherError, match="malformed voucher: bad peer id"):
        decode_voucher(envelope)
    with pytest.raises(VoucherError):
        open_voucher(envelope, RELAY.peer_id, PEER.peer_id, now=0)

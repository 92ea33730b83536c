"""Peer IDs match the libp2p peer-ids spec; signatures verify and reject tampering."""
import pytest

from node.identity import (
    Identity,
    InvalidPeerId,
    b58decode,
    b58encode,
    is_valid_peer_id,
    public_key_from_peer_id,
    verify,
    verify_by_peer_id,
)


def test_known_peer_id_for_zero_seed():
    # Cross-checked against py-libp2p 0.8.1 (ID.from_pubkey on the same ed25519 key).
    ident = Identity.from_seed(bytes(32))
    assert ident.peer_id == "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
    assert public_key_from_peer_id(ident.peer_id) == ident.public_key


def test_generated_ids_round_trip_and_sign():
    ident = Identity.generate()
    assert ident.peer_id.startswith("12D3KooW")
    sig = ident.sign(b"hello")
    assert verify(ident.public_key, b"hello", sig)
    assert verify_by_peer_id(ident.peer_id, b"hello", sig)
    assert not verify(ident.public_key, b"hellO", sig)
    assert not verify(ident.public_key, b"hello", sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not verify(ident.public_key, b"hello", b"short")


@pytest.mark.parametrize("bad", ["", "0OIl", "12D3KooW", "Qm" + "1" * 44, "é"])
def test_bad_peer_ids_rejected(bad):
    assert not is_valid_peer_id(bad)
    with pytest.raises(InvalidPeerId):
        public_key_from_peer_id(bad)


def test_base58_leading_zeros():
    for raw in [b"", b"\0", b"\0\0\x01", b"\xff" * 5]:
        assert b58decode(b58encode(raw)) == raw

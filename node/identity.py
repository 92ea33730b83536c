"""Node identity: ed25519 keys (pynacl) and libp2p peer IDs.

The peer ID follows the libp2p peer-ids spec: the protobuf-encoded PublicKey
{Type: Ed25519, Data: 32-byte key} wrapped in an identity multihash and written in
base58btc, which gives the familiar ``12D3KooW...`` strings. The same string is the
node's ledger account address. This module holds no file I/O (see node.keystore).
"""
from __future__ import annotations

from dataclasses import dataclass

import nacl.exceptions
import nacl.signing

KEY_TYPE_ED25519 = 1
_PROTO_PREFIX = bytes([0x08, KEY_TYPE_ED25519, 0x12, 0x20])  # field 1 varint=1, field 2 len=32
_IDENTITY_MULTIHASH = bytes([0x00, len(_PROTO_PREFIX) + 32])
_B58_ALPHABET = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}


class InvalidPeerId(ValueError):
    """A string or byte sequence is not a valid ed25519 libp2p peer ID."""


class InvalidSignature(ValueError):
    """A signature did not verify."""


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = bytearray()
    while n:
        n, r = divmod(n, 58)
        out.append(_B58_ALPHABET[r])
    pad = len(data) - len(data.lstrip(b"\0"))
    return (b"1" * pad + bytes(reversed(out))).decode("ascii")


def b58decode(text: str) -> bytes:
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError as exc:
        raise InvalidPeerId("not base58") from exc
    n = 0
    for c in raw:
        if c not in _B58_INDEX:
            raise InvalidPeerId(f"invalid base58 character {chr(c)!r}")
        n = n * 58 + _B58_INDEX[c]
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    pad = len(raw) - len(raw.lstrip(b"1"))
    return b"\0" * pad + body


def public_key_protobuf(public_key: bytes) -> bytes:
    """The libp2p protobuf ``PublicKey`` message for an ed25519 key."""
    if len(public_key) != 32:
        raise ValueError("ed25519 public key must be 32 bytes")
    return _PROTO_PREFIX + public_key


def public_key_from_protobuf(data: bytes) -> bytes:
    """Parse a protobuf ``PublicKey``; only ed25519 keys are accepted."""
    if len(data) != 36 or data[:4] != _PROTO_PREFIX:
        raise InvalidPeerId("unsupported or malformed PublicKey protobuf (need ed25519)")
    return bytes(data[4:])


def peer_id_bytes_from_public_key(public_key: bytes) -> bytes:
    """The binary peer ID (identity multihash of the protobuf key)."""
    return _IDENTITY_MULTIHASH + public_key_protobuf(public_key)


def peer_id_from_public_key(public_key: bytes) -> str:
    return b58encode(peer_id_bytes_from_public_key(public_key))


def public_key_from_peer_id_bytes(raw: bytes) -> bytes:
    if len(raw) != 38 or raw[:2] != _IDENTITY_MULTIHASH:
        raise InvalidPeerId("peer ID is not an identity multihash of an ed25519 key")
    return public_key_from_protobuf(raw[2:])


def public_key_from_peer_id(peer_id: str) -> bytes:
    """Recover the ed25519 public key embedded in a ``12D3KooW...`` peer ID."""
    return public_key_from_peer_id_bytes(b58decode(peer_id))


def is_valid_peer_id(peer_id: str) -> bool:
    try:
        public_key_from_peer_id(peer_id)
    except InvalidPeerId:
        return False
    return True


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Verify an ed25519 signature; never raises on bad input."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError, TypeError):
        return False
    return True


def verify_by_peer_id(peer_id: str, message: bytes, signature: bytes) -> bool:
    try:
        return verify(public_key_from_peer_id(peer_id), message, signature)
    except InvalidPeerId:
        return False


@dataclass(frozen=True)
class Identity:
    """An ed25519 key pair and the peer ID derived from it."""

    signing_key: nacl.signing.SigningKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        if len(seed) != 32:
            raise ValueError("ed25519 seed must be 32 bytes")
        return cls(nacl.signing.SigningKey(seed))

    @property
    def seed(self) -> bytes:
        return bytes(self.signing_key)

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    @property
    def public_key_protobuf(self) -> bytes:
        return public_key_protobuf(self.public_key)

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    @property
    def peer_id_bytes(self) -> bytes:
        return peer_id_bytes_from_public_key(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self.signing_key.sign(message).signature

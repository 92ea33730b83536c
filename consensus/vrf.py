"""ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381, suite 0x03) on libsodium's edwards25519 group (PyNaCl).

A verifiable random function: only the holder of an ed25519 key can compute ``beta`` for an input
``alpha``, everyone can check it from the public key and the 80-byte proof ``pi``, and for one key and
input there is exactly one ``beta`` (unlike an ed25519 signature, whose nonce a signer may choose).
Keys are RFC 8032 ed25519 keys: the secret is the 32-byte seed, the public key the 32-byte point.
The group operations are libsodium's (constant-time scalar multiplication); what this module adds is
the RFC's encoding: try-and-increment hash to curve, nonce, challenge and proof-to-hash. Checked
against RFC 9381 Appendix B.3 (tests/consensus/test_vrf.py). No I/O here.

Verification is a little stricter than the RFC: the public key and Gamma must lie in the prime-order
subgroup (libsodium's scalar multiplication refuses other points). An honest proof always does.
"""
from __future__ import annotations

import hashlib

from nacl import bindings as sodium
from nacl.exceptions import CryptoError

SUITE = b"\x03"
PROOF_BYTES = 80
OUTPUT_BYTES = 64
_Q = 2**252 + 27742317777372353535851937790883648493   # the prime order of the base point
_P = 2**255 - 19


class VrfError(ValueError):
    """A proof that does not verify, or bytes that are not a proof or a key."""


def _clamp(digest32: bytes) -> int:
    x = bytearray(digest32)
    x[0] &= 248
    x[31] &= 127
    x[31] |= 64
    return int.from_bytes(x, "little")


def _scalar(n: int) -> bytes:
    return n.to_bytes(32, "little")


def _is_point(s: bytes) -> bool:
    """RFC 8032 decoding succeeds (canonical y, x exists, no negative zero)."""
    y = int.from_bytes(s, "little") & ((1 << 255) - 1)
    if y >= _P or (s[31] >> 7 and y in (1, _P - 1)):
        return False
    try:
        sodium.crypto_core_ed25519_add(s, s)
    except (CryptoError, RuntimeError, ValueError):
        return False
    return True


def _times_cofactor(point: bytes) -> bytes:
    for _ in range(3):
        point = sodium.crypto_core_ed25519_add(point, point)
    return point


def _mul(scalar: int, point: bytes) -> bytes:
    return sodium.crypto_scalarmult_ed25519_noclamp(_scalar(scalar), point)


def _mul_base(scalar: int) -> bytes:
    return sodium.crypto_scalarmult_ed25519_base_noclamp(_scalar(scalar))


def _encode_to_curve(public_key: bytes, alpha: bytes) -> bytes:
    """RFC 9381 5.4.1.1 (try-and-increment): the first hash that decodes as a point, times the cofactor."""
    for ctr in range(256):
        digest = hashlib.sha512(SUITE + b"\x01" + public_key + alpha + bytes([ctr]) + b"\x00").digest()[:32]
        if _is_point(digest):
            return _times_cofactor(digest)
    raise VrfError("no point found for this input")   # probability about 2**-256


def _challenge(*points: bytes) -> int:
    digest = hashlib.sha512(SUITE + b"\x02" + b"".join(points) + b"\x00").digest()
    return int.from_bytes(digest[:16], "little")


def public_key(seed: bytes) -> bytes:
    """The ed25519 public key of a 32-byte seed (the RFC 8032 one)."""
    return _mul_base(_clamp(hashlib.sha512(seed).digest()[:32]))


def prove(seed: bytes, alpha: bytes) -> bytes:
    """The 80-byte proof ``pi`` for ``alpha`` under the key with ed25519 seed ``seed``."""
    if len(seed) != 32:
        raise VrfError("an ed25519 seed is 32 bytes")
    expanded = hashlib.sha512(seed).digest()
    x = _clamp(expanded[:32])
    y = _mul_base(x)
    h = _encode_to_curve(y, alpha)
    gamma = _mul(x, h)
    k = int.from_bytes(hashlib.sha512(expanded[32:] + h).digest(), "little") % _Q
    c = _challenge(y, h, gamma, _mul_base(k), _mul(k, h))
    s = (k + c * x) % _Q
    return gamma + c.to_bytes(16, "little") + _scalar(s)


def proof_to_hash(pi: bytes) -> bytes:
    """The 64-byte output ``beta`` of a proof (only meaningful once ``verify`` accepted it)."""
    if len(pi) != PROOF_BYTES or not _is_point(pi[:32]):
        raise VrfError(f"a proof is {PROOF_BYTES} bytes starting with a curve point")
    return hashlib.sha512(SUITE + b"\x03" + _times_cofactor(pi[:32]) + b"\x00").digest()


def verify(public_key_bytes: bytes, alpha: bytes, pi: bytes) -> bytes:
    """``beta`` when ``pi`` proves ``alpha`` under ``public_key_bytes``; else VrfError."""
    if type(pi) is not bytes or len(pi) != PROOF_BYTES:
        raise VrfError(f"a proof is {PROOF_BYTES} bytes")
    if len(public_key_bytes) != 32 or not sodium.crypto_core_ed25519_is_valid_point(public_key_bytes):
        raise VrfError("the public key is not a valid ed25519 point")
    gamma, c, s = pi[:32], int.from_bytes(pi[32:48], "little"), int.from_bytes(pi[48:], "little")
    if s >= _Q or not _is_point(gamma):
        raise VrfError("malformed proof")
    try:
        h = _encode_to_curve(public_key_bytes, alpha)
        u = sodium.crypto_core_ed25519_sub(_mul_base(s), _mul(c, public_key_bytes))
        v = sodium.crypto_core_ed25519_sub(_mul(s, h), _mul(c, gamma))
    except (CryptoError, RuntimeError, ValueError):
        raise VrfError("the proof does not verify") from None
    if _challenge(public_key_bytes, h, gamma, u, v) != c:
        raise VrfError("the proof does not verify")
    return proof_to_hash(pi)

"""ChaCha20-Poly1305 (IETF, 96-bit nonce) through the ``cryptography`` package's public API.

The one AEAD of the node (ADR 0121): noise handshake messages (``seal``/``open``, with associated
data) and transport frames (``seal_into``/``open_into``, which encrypt and decrypt straight into
caller buffers with ``encrypt_into``/``decrypt_into``: no Python-level copies, src and dst are
memoryviews into the caller's buffers). ``seal_into`` writes ``len(src) + 16`` bytes into ``dst``;
``open_into`` writes ``len(src) - 16`` bytes; a bad tag raises ``AuthenticationFailed``.
"""
from __future__ import annotations

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

TAG_LEN = 16
KEY_LEN = 32
NAME = "openssl"  # cryptography runs OpenSSL's ChaCha20-Poly1305


class AuthenticationFailed(ValueError):
    """The ciphertext or its tag was altered, or the key, nonce or associated data is wrong."""


class ChaChaPoly:
    """One key's ChaCha20-Poly1305; nonces are the caller's (12 bytes each)."""

    __slots__ = ("_aead", "_decrypt_into", "_encrypt_into")

    name = NAME

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_LEN:
            raise ValueError("ChaCha20-Poly1305 key must be 32 bytes")
        self._aead = ChaCha20Poly1305(bytes(key))
        self._encrypt_into = self._aead.encrypt_into
        self._decrypt_into = self._aead.decrypt_into

    def seal(self, nonce: bytes, ad: bytes | None, plaintext: bytes) -> bytes:
        """``plaintext`` encrypted, its 16-byte tag (over ``ad`` too) appended."""
        return self._aead.encrypt(nonce, plaintext, ad)

    def open(self, nonce: bytes, ad: bytes | None, ciphertext: bytes) -> bytes:
        """The plaintext of ``seal``'s output; AuthenticationFailed on a bad tag."""
        try:
            return self._aead.decrypt(nonce, ciphertext, ad)
        except InvalidTag as exc:
            raise AuthenticationFailed("ChaCha20-Poly1305 tag mismatch") from exc

    def seal_into(self, nonce: bytes, src: memoryview, dst: memoryview) -> None:
        """Encrypt ``src`` into ``dst`` (exactly ``len(src) + 16`` bytes), no associated data."""
        if len(dst) != len(src) + TAG_LEN:
            raise ValueError("dst must be exactly len(src) + 16 bytes")
        self._encrypt_into(nonce, src, None, dst)

    def open_into(self, nonce: bytes, src: memoryview, dst: memoryview) -> None:
        """Decrypt ``src`` into ``dst`` (exactly ``len(src) - 16`` bytes); AuthenticationFailed on a bad tag."""
        if len(src) < TAG_LEN or len(dst) != len(src) - TAG_LEN:
            raise ValueError("dst must be exactly len(src) - 16 bytes")
        try:
            self._decrypt_into(nonce, src, None, dst)
        except InvalidTag as exc:
            raise AuthenticationFailed("ChaCha20-Poly1305 tag mismatch") from exc

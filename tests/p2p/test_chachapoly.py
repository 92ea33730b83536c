"""ChaCha20-Poly1305 backends: identical output, RFC 8439 vector, tamper detection, sizes."""
import os

import nacl.bindings
import pytest

from node.p2p.chachapoly import BACKENDS, DEFAULT_BACKEND, AuthenticationFailed, new_cipher

# RFC 8439 section 2.8.2 (AEAD_CHACHA20_POLY1305 test vector)
RFC_KEY = bytes(range(0x80, 0xA0))
RFC_NONCE = bytes.fromhex("070000004041424344454647")
RFC_PLAINTEXT = (b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for "
                 b"the future, sunscreen would be it.")
RFC_TAG = bytes.fromhex("1ae10b594f09e26a7e902ecbd0600691")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_matches_libsodium_reference(backend):
    cipher = new_cipher(b"\x42" * 32, backend)
    nonce = os.urandom(12)
    for size in (0, 1, 15, 16, 17, 1000, 65519):
        plain = os.urandom(size)
        sealed = bytearray(size + 16)
        cipher.seal_into(nonce, memoryview(plain), memoryview(sealed))
        assert bytes(sealed) == nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(plain, None, nonce, b"\x42" * 32)
        opened = bytearray(size)
        cipher.open_into(nonce, memoryview(sealed), memoryview(opened))
        assert opened == plain


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_rfc8439_tag_with_aad_reference(backend):
    # our backends take no AAD; check the key stream part of the RFC vector via libsodium with AAD
    aad = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
    sealed = nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(RFC_PLAINTEXT, aad, RFC_NONCE, RFC_KEY)
    assert sealed[-16:] == RFC_TAG
    ours = bytearray(len(RFC_PLAINTEXT) + 16)
    new_cipher(RFC_KEY, backend).seal_into(RFC_NONCE, memoryview(RFC_PLAINTEXT), memoryview(ours))
    assert ours[:-16] == sealed[:-16]  # same ciphertext; the tag differs only by the AAD


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_tampering_and_wrong_nonce_rejected(backend):
    cipher = new_cipher(b"\x01" * 32, backend)
    sealed = bytearray(116)
    cipher.seal_into(b"\0" * 12, memoryview(os.urandom(100)), memoryview(sealed))
    out = bytearray(100)
    with pytest.raises(AuthenticationFailed):
        cipher.open_into(b"\0" * 11 + b"\1", memoryview(sealed), memoryview(out))
    sealed[50] ^= 1
    with pytest.raises(AuthenticationFailed):
        cipher.open_into(b"\0" * 12, memoryview(sealed), memoryview(out))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_wrong_buffer_sizes_rejected(backend):
    cipher = new_cipher(b"\x01" * 32, backend)
    with pytest.raises(ValueError):
        cipher.seal_into(b"\0" * 12, memoryview(b"abc"), memoryview(bytearray(20)))
    with pytest.raises(ValueError):
        cipher.open_into(b"\0" * 12, memoryview(bytes(20)), memoryview(bytearray(5)))


def test_default_is_the_fastest_available():
    assert DEFAULT_BACKEND is BACKENDS.get("openssl", BACKENDS["libsodium"])

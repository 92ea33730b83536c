"""ChaCha20-Poly1305 via cryptography: libsodium-identical output, RFC 8439 vector, tamper detection, sizes."""
import os

import nacl.bindings
import pytest

from node.p2p.chachapoly import AuthenticationFailed, ChaChaPoly

# RFC 8439 section 2.8.2 (AEAD_CHACHA20_POLY1305 test vector)
RFC_KEY = bytes(range(0x80, 0xA0))
RFC_NONCE = bytes.fromhex("070000004041424344454647")
RFC_AAD = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
RFC_PLAINTEXT = (b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for "
                 b"the future, sunscreen would be it.")
RFC_CIPHERTEXT_HEAD = bytes.fromhex("d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6")
RFC_TAG = bytes.fromhex("1ae10b594f09e26a7e902ecbd0600691")


def test_matches_libsodium_reference():
    cipher = ChaChaPoly(b"\x42" * 32)
    nonce = os.urandom(12)
    for size in (0, 1, 15, 16, 17, 1000, 65519):
        plain = os.urandom(size)
        reference = nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(plain, None, nonce, b"\x42" * 32)
        sealed = bytearray(size + 16)
        cipher.seal_into(nonce, memoryview(plain), memoryview(sealed))
        assert bytes(sealed) == reference
        opened = bytearray(size)
        cipher.open_into(nonce, memoryview(sealed), memoryview(opened))
        assert opened == plain
        ad = os.urandom(32)
        assert cipher.seal(nonce, ad, plain) == nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(
            plain, ad, nonce, b"\x42" * 32)


def test_rfc8439_vector():
    cipher = ChaChaPoly(RFC_KEY)
    sealed = cipher.seal(RFC_NONCE, RFC_AAD, RFC_PLAINTEXT)
    assert sealed[:32] == RFC_CIPHERTEXT_HEAD and sealed[-16:] == RFC_TAG
    assert cipher.open(RFC_NONCE, RFC_AAD, sealed) == RFC_PLAINTEXT
    ours = bytearray(len(RFC_PLAINTEXT) + 16)
    cipher.seal_into(RFC_NONCE, memoryview(RFC_PLAINTEXT), memoryview(ours))
    assert ours[:-16] == sealed[:-16]  # same ciphertext; without AAD only the tag differs
    assert ours[-16:] != RFC_TAG


def test_tampering_wrong_nonce_and_wrong_ad_rejected():
    cipher = ChaChaPoly(b"\x01" * 32)
    sealed = bytearray(116)
    cipher.seal_into(b"\0" * 12, memoryview(os.urandom(100)), memoryview(sealed))
    out = bytearray(100)
    with pytest.raises(AuthenticationFailed):
        cipher.open_into(b"\0" * 11 + b"\1", memoryview(sealed), memoryview(out))
    sealed[50] ^= 1
    with pytest.raises(AuthenticationFailed):
        cipher.open_into(b"\0" * 12, memoryview(sealed), memoryview(out))
    handshake = cipher.seal(b"\0" * 12, b"hash", b"payload")
    with pytest.raises(AuthenticationFailed):
        cipher.open(b"\0" * 12, b"hasH", handshake)


def test_wrong_sizes_rejected():
    with pytest.raises(ValueError):
        ChaChaPoly(b"\x01" * 31)
    cipher = ChaChaPoly(b"\x01" * 32)
    with pytest.raises(ValueError):
        cipher.seal_into(b"\0" * 12, memoryview(b"abc"), memoryview(bytearray(20)))
    with pytest.raises(ValueError):
        cipher.open_into(b"\0" * 12, memoryview(bytes(20)), memoryview(bytearray(5)))
    with pytest.raises(ValueError):
        cipher.open_into(b"\0" * 12, memoryview(bytes(10)), memoryview(bytearray(0)))


def test_seals_into_a_slice_of_a_larger_buffer():
    """The transport seals frames into slices of one output buffer: nothing outside the slice changes."""
    cipher = ChaChaPoly(b"\x07" * 32)
    plain = os.urandom(1000)
    out = bytearray(b"\xaa" * 1100)
    with memoryview(out) as dst:
        cipher.seal_into(b"\0" * 12, memoryview(plain)[100:600], dst[40:556])
    assert out[:40] == b"\xaa" * 40 and out[556:] == b"\xaa" * 544
    back = bytearray(500)
    cipher.open_into(b"\0" * 12, memoryview(out)[40:556], memoryview(back))
    assert back == plain[100:600]

"""Passphrase encryption of a key seed: scrypt KDF + ChaCha20-Poly1305 AEAD (docs/adr/0161).

The shape follows geth's keystore v3 and EIP-2335: the KDF and its parameters, the cipher, its
nonce and the ciphertext are stored next to each other, and everything that is not secret (key
type, peer ID, KDF parameters) is authenticated as associated data, so a file whose peer ID or
parameters were edited fails to decrypt instead of yielding a key that is silently different.
KDF parameters read from a file are bounded before use: a hostile file cannot make the node
allocate gigabytes or spin for minutes.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

KDF_NAME = "scrypt"
CIPHER_NAME = "chacha20-poly1305"
DEFAULT_LOG2_N = 17           # n = 131072, r = 8: 128 MiB and ~0.4 s per unlock on a server core
MAX_LOG2_N = 20               # 1 GiB with r = 8: the most a key file may ask for
MAX_R = 16
MAX_P = 4
SALT_BYTES = 32
NONCE_BYTES = 12


class DecryptError(Exception):
    """Wrong passphrase, or the encrypted key was altered."""


class BadParameters(ValueError):
    """KDF or cipher parameters outside what this keystore accepts."""


@dataclass(frozen=True)
class ScryptParams:
    log2_n: int = DEFAULT_LOG2_N
    r: int = 8
    p: int = 1

    def check(self) -> None:
        for name, value, low, high in (("log2_n", self.log2_n, 10, MAX_LOG2_N), ("r", self.r, 1, MAX_R),
                                       ("p", self.p, 1, MAX_P)):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise BadParameters(f"scrypt {name} must be an integer in [{low}, {high}], got {value!r}")

    @property
    def memory_bytes(self) -> int:
        return 128 * self.r * (1 << self.log2_n)


def derive_key(passphrase: bytes, salt: bytes, params: ScryptParams) -> bytes:
    """The 32-byte encryption key for ``passphrase`` (blocking: tenths of a second by design)."""
    params.check()
    return hashlib.scrypt(passphrase, salt=salt, n=1 << params.log2_n, r=params.r, p=params.p,
                          maxmem=params.memory_bytes + (1 << 20), dklen=32)


def associated_data(header: dict[str, Any]) -> bytes:
    """The canonical bytes of the authenticated, unencrypted part of a key file."""
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode()


def encrypt_secret(secret: bytes, passphrase: bytes, header: dict[str, Any],
                   params: ScryptParams | None = None) -> dict[str, Any]:
    """The ``crypto`` section that stores ``secret`` under ``passphrase``; ``header`` is authenticated."""
    params = params or ScryptParams()
    salt, nonce = os.urandom(SALT_BYTES), os.urandom(NONCE_BYTES)
    kdf = {"name": KDF_NAME, "log2_n": params.log2_n, "r": params.r, "p": params.p, "salt": salt.hex()}
    key = derive_key(passphrase, salt, params)
    ciphertext = ChaCha20Poly1305(key).encrypt(nonce, secret, associated_data({**header, "kdf": kdf}))
    return {"kdf": kdf, "cipher": {"name": CIPHER_NAME, "nonce": nonce.hex()}, "ciphertext": ciphertext.hex()}


def decrypt_secret(crypto: dict[str, Any], passphrase: bytes, header: dict[str, Any]) -> bytes:
    """The secret stored in ``crypto``; raises BadParameters for a malformed section, DecryptError
    for a wrong passphrase or altered contents."""
    try:
        kdf, cipher = crypto["kdf"], crypto["cipher"]
        if kdf["name"] != KDF_NAME or cipher["name"] != CIPHER_NAME:
            raise BadParameters(f"unsupported kdf/cipher {kdf['name']!r}/{cipher['name']!r}; "
                                f"this dekube reads {KDF_NAME}/{CIPHER_NAME}")
        params = ScryptParams(kdf["log2_n"], kdf["r"], kdf["p"])
        salt, nonce = bytes.fromhex(kdf["salt"]), bytes.fromhex(cipher["nonce"])
        ciphertext = bytes.fromhex(crypto["ciphertext"])
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, BadParameters):
            raise
        raise BadParameters(f"malformed crypto section ({type(exc).__name__}: {exc})") from None
    if len(salt) < 16 or len(nonce) != NONCE_BYTES:
        raise BadParameters("salt must be at least 16 bytes and the nonce 12 bytes")
    params.check()
    key = derive_key(passphrase, salt, params)
    try:
        return ChaCha20Poly1305(key).decrypt(nonce, ciphertext, associated_data({**header, "kdf": kdf}))
    except InvalidTag:
        raise DecryptError("wrong passphrase, or the key file was altered") from None

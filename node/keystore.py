"""Keystore: the node's ed25519 seed in a 0600 JSON key file, written atomically, loaded strictly.

File formats::

    version 2 (encrypted, the default; docs/adr/0161):
    {"version": 2, "type": "ed25519", "peer_id": "12D3KooW...",
     "crypto": {"kdf": {"name": "scrypt", "log2_n": 17, "r": 8, "p": 1, "salt": "<hex>"},
                "cipher": {"name": "chacha20-poly1305", "nonce": "<hex>"}, "ciphertext": "<hex>"}}
    version 1 (plaintext, for throwaway dev networks: --insecure-unencrypted-key):
    {"version": 1, "type": "ed25519", "seed": "<64 hex chars>", "peer_id": "12D3KooW..."}

The peer ID is derived from the seed, so it doubles as a checksum: a flipped bit in the seed gives
a different peer ID and the file is refused. Loading never regenerates a key; every refusal says
which file is wrong and how to fix it. A passphrase is asked for (through the ``passphrase``
callable the caller gives) only when the file is encrypted. This module only reads and writes key
files; key maths live in node.identity, the encryption in node.key_encryption.
"""
from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.identity import Identity
from node.key_encryption import BadParameters, DecryptError, ScryptParams, decrypt_secret, encrypt_secret

KEY_FILE_NAME = "node_key.json"
PLAINTEXT_VERSION = 1
ENCRYPTED_VERSION = 2
KEY_TYPE = "ed25519"
MAX_KEY_FILE_BYTES = 4096
_FIELDS = {PLAINTEXT_VERSION: {"version", "type", "seed", "peer_id"},
           ENCRYPTED_VERSION: {"version", "type", "peer_id", "crypto"}}

# a passphrase, or a function that gets one (a prompt) called only when a file is encrypted
Passphrase = bytes | Callable[[], bytes] | None


class KeystoreError(Exception):
    """A key file is missing, unsafe, corrupt or in an unknown format (message says the fix)."""


class KeyFileExists(KeystoreError):
    """Refused to overwrite an existing key file."""


class PassphraseRequired(KeystoreError):
    """The key file is encrypted and no passphrase was given."""


def _header(version: int, peer_id: str) -> dict[str, object]:
    return {"version": version, "type": KEY_TYPE, "peer_id": peer_id}


def encode_key_file(identity: Identity, passphrase: bytes | None = None,
                    params: ScryptParams | None = None) -> bytes:
    """The key file bytes: encrypted under ``passphrase`` (version 2), or plaintext (version 1) when None."""
    if passphrase is None:
        doc = {"version": PLAINTEXT_VERSION, "type": KEY_TYPE, "seed": identity.seed.hex(),
               "peer_id": identity.peer_id}
    else:
        if not passphrase:
            raise KeystoreError("an empty passphrase encrypts nothing; give one, or use "
                                "--insecure-unencrypted-key for a throwaway dev key")
        header = _header(ENCRYPTED_VERSION, identity.peer_id)
        doc = {**header, "crypto": encrypt_secret(identity.seed, passphrase, header, params)}
    return (json.dumps(doc, indent=2) + "\n").encode()


def is_encrypted(data: bytes) -> bool:
    """Whether key file contents are the encrypted format (False for anything unparsable)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("version") == ENCRYPTED_VERSION


def _seed_of(doc: dict[str, Any], path: Path | str, passphrase: Passphrase) -> bytes:
    if doc["version"] == PLAINTEXT_VERSION:
        seed_hex = doc["seed"]
        if not isinstance(seed_hex, str) or len(seed_hex) != 64:
            raise KeystoreError(f"key file {path} is corrupt: 'seed' must be 64 hex characters")
        try:
            return bytes.fromhex(seed_hex)
        except ValueError:
            raise KeystoreError(f"key file {path} is corrupt: 'seed' is not hex") from None
    if passphrase is None:
        raise PassphraseRequired(
            f"key file {path} is encrypted: give its passphrase with --passphrase-file FILE, the "
            f"DEKUBE_KEY_PASSPHRASE environment variable, or at the prompt")
    secret = passphrase() if callable(passphrase) else passphrase
    try:
        seed = decrypt_secret(doc["crypto"], secret, _header(ENCRYPTED_VERSION, doc["peer_id"]))
    except BadParameters as exc:
        raise KeystoreError(f"key file {path} is corrupt: {exc}") from None
    except DecryptError:
        raise KeystoreError(f"cannot unlock key file {path}: wrong passphrase, or the file was altered") from None
    if len(seed) != 32:
        raise KeystoreError(f"key file {path} is corrupt: the decrypted seed is {len(seed)} bytes, not 32")
    return seed


def decode_key_file(data: bytes, path: Path | str = "<key file>", passphrase: Passphrase = None) -> Identity:
    """Parse and check key file contents; raises KeystoreError naming ``path`` on any defect."""
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeystoreError(f"key file {path} is {len(data)} bytes, too large to be a dekube key file")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise KeystoreError(
            f"key file {path} is corrupt or truncated (not valid JSON); restore it from a backup "
            f"or create a new key with 'dekube-node keys new --force' (this changes the node's peer ID)"
        ) from None
    if not isinstance(doc, dict):
        raise KeystoreError(f"key file {path} is not a dekube key file (expected a JSON object)")
    version = doc.get("version")
    if version not in _FIELDS or isinstance(version, bool):
        raise KeystoreError(
            f"key file {path} has unknown format version {version!r}; this dekube reads versions "
            f"{PLAINTEXT_VERSION} and {ENCRYPTED_VERSION}"
        )
    missing = _FIELDS[version] - doc.keys()
    extra = doc.keys() - _FIELDS[version]
    if missing or extra:
        raise KeystoreError(
            f"key file {path} is malformed: missing fields {sorted(missing)}, unexpected fields {sorted(extra)}"
        )
    if doc["type"] != KEY_TYPE:
        raise KeystoreError(f"key file {path} holds an unsupported key type {doc['type']!r} (need {KEY_TYPE!r})")
    if not isinstance(doc["peer_id"], str):
        raise KeystoreError(f"key file {path} is corrupt: 'peer_id' must be a string")
    identity = Identity.from_seed(_seed_of(doc, path, passphrase))
    if doc["peer_id"] != identity.peer_id:
        raise KeystoreError(
            f"key file {path} is corrupt: its seed gives peer ID {identity.peer_id} but the file "
            f"records {doc['peer_id']!r}; restore the file from a backup"
        )
    return identity


def save_identity(path: Path | str, identity: Identity, *, overwrite: bool = False,
                  passphrase: bytes | None = None, params: ScryptParams | None = None) -> Path:
    """Write ``identity`` to ``path`` with mode 0600, atomically and durably: encrypted under
    ``passphrase`` (blocking: the KDF takes tenths of a second), or plaintext when it is None.

    The data goes to a temporary file created 0600 in the same directory (never world-readable,
    not even for an instant), is fsynced, then linked into place (``overwrite=False``: fails with
    KeyFileExists if the path exists, with no race) or renamed over it; the directory is fsynced.
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not overwrite and path.exists():
        raise KeyFileExists(f"key file {path} already exists; refusing to overwrite it "
                            "(use --force to replace the key)")
    contents = encode_key_file(identity, passphrase, params)
    tmp = directory / f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # a umask can only remove bits; make the mode exact
            os.write(fd, contents)
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise KeyFileExists(
                    f"key file {path} already exists; refusing to overwrite it (use --force to replace the key)"
                ) from None
            os.unlink(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return path


def read_key_file(path: Path | str) -> bytes:
    """The bytes of a key file, refusing missing, group/other-accessible or non-regular files."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise KeystoreError(
            f"key file {path} not found; create one with 'dekube-node init --home DIR' or 'dekube-node keys new'"
        ) from None
    except OSError as exc:
        raise KeystoreError(f"cannot open key file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeystoreError(f"key file {path} is not a regular file")
        loose = stat.S_IMODE(info.st_mode) & 0o077
        if loose:
            raise KeystoreError(
                f"key file {path} has permissions {stat.S_IMODE(info.st_mode):04o}, open to group/others; "
                f"the key may have leaked. Fix with: chmod 600 {path}"
            )
        return os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)


def load_identity(path: Path | str, passphrase: Passphrase = None) -> Identity:
    """Load a key file, refusing missing, group/other-accessible, corrupt or unknown-format files;
    an encrypted one needs ``passphrase`` (or a callable giving it, called only then)."""
    return decode_key_file(read_key_file(path), path, passphrase)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

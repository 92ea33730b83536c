"""Keystore: the node's ed25519 seed in a 0600 JSON key file, written atomically, loaded strictly.

File format (version 1)::

    {"version": 1, "type": "ed25519", "seed": "<64 hex chars>", "peer_id": "12D3KooW..."}

The peer ID is derived from the seed, so it doubles as a checksum: a flipped bit in the seed gives
a different peer ID and the file is refused. Loading never regenerates a key; every refusal says
which file is wrong and how to fix it. This module only reads and writes key files; key maths live
in node.identity.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from node.identity import Identity

KEY_FILE_NAME = "node_key.json"
FORMAT_VERSION = 1
KEY_TYPE = "ed25519"
MAX_KEY_FILE_BYTES = 4096
_FIELDS = {"version", "type", "seed", "peer_id"}


class KeystoreError(Exception):
    """A key file is missing, unsafe, corrupt or in an unknown format (message says the fix)."""


class KeyFileExists(KeystoreError):
    """Refused to overwrite an existing key file."""


def encode_key_file(identity: Identity) -> bytes:
    doc = {"version": FORMAT_VERSION, "type": KEY_TYPE, "seed": identity.seed.hex(), "peer_id": identity.peer_id}
    return (json.dumps(doc, indent=2) + "\n").encode()


def decode_key_file(data: bytes, path: Path | str = "<key file>") -> Identity:
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
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise KeystoreError(
            f"key file {path} has unknown format version {version!r}; this dekube reads version {FORMAT_VERSION}"
        )
    missing = _FIELDS - doc.keys()
    extra = doc.keys() - _FIELDS
    if missing or extra:
        raise KeystoreError(
            f"key file {path} is malformed: missing fields {sorted(missing)}, unexpected fields {sorted(extra)}"
        )
    if doc["type"] != KEY_TYPE:
        raise KeystoreError(f"key file {path} holds an unsupported key type {doc['type']!r} (need {KEY_TYPE!r})")
    seed_hex = doc["seed"]
    if not isinstance(seed_hex, str) or len(seed_hex) != 64:
        raise KeystoreError(f"key file {path} is corrupt: 'seed' must be 64 hex characters")
    try:
        seed = bytes.fromhex(seed_hex)
    except ValueError:
        raise KeystoreError(f"key file {path} is corrupt: 'seed' is not hex") from None
    identity = Identity.from_seed(seed)
    if doc["peer_id"] != identity.peer_id:
        raise KeystoreError(
            f"key file {path} is corrupt: its seed gives peer ID {identity.peer_id} but the file "
            f"records {doc['peer_id']!r}; restore the file from a backup"
        )
    return identity


def save_identity(path: Path | str, identity: Identity, *, overwrite: bool = False) -> Path:
    """Write ``identity`` to ``path`` with mode 0600, atomically and durably.

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
    tmp = directory / f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # a umask can only remove bits; make the mode exact
            os.write(fd, encode_key_file(identity))
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


def load_identity(path: Path | str) -> Identity:
    """Load a key file, refusing missing, group/other-accessible, corrupt or unknown-format files."""
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
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    return decode_key_file(data, path)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

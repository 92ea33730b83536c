"""A key's passphrase in the OS keyring (the optional ``keyring`` package: Secret Service, macOS Keychain,
Windows Credential Locker), so that a provider is asked once (docs/adr/0198).

Entries are under the service ``dekube`` and named by the key file's absolute path. Without the package,
or with no usable backend (a CI container, a server without a session bus: keyring's ``fail`` or
``null`` backend), every function answers "not available" (None/False) and the CLI falls back to the
passphrase file, ``$DEKUBE_KEY_PASSPHRASE`` or the prompt. A backend that fails (locked, D-Bus gone) is
treated the same, never as an error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

SERVICE = "dekube"
MAX_SECRET_BYTES = 4096


def backend() -> Any | None:
    """The keyring backend in use, or None when there is none worth using."""
    try:
        import keyring
        found = keyring.get_keyring()
    except Exception:   # not installed, or its backend discovery failed
        return None
    if getattr(found, "priority", 0) <= 0:   # keyring.backends.fail / null: nothing would be stored
        return None
    return found


def _name(key_file: Path) -> str:
    return str(Path(key_file).expanduser().resolve())


def load(key_file: Path) -> bytes | None:
    """The passphrase stored for ``key_file``, or None."""
    found = backend()
    if found is None:
        return None
    try:
        secret = found.get_password(SERVICE, _name(key_file))
    except Exception:
        return None
    if not secret or len(secret.encode()) > MAX_SECRET_BYTES:
        return None
    return secret.encode()


def store(key_file: Path, passphrase: bytes) -> bool:
    """Keep ``passphrase`` for ``key_file``; False when no keyring could take it."""
    found = backend()
    if found is None:
        return False
    try:
        found.set_password(SERVICE, _name(key_file), passphrase.decode())
    except Exception:
        return False
    return True

"""Where the CLI gets a key passphrase: ``--passphrase-file``, ``$DEKUBE_KEY_PASSPHRASE``, the OS keyring
(where the caller names the key file and ``dekube-node provide`` stored it there: cli/keyring_store.py) or
a prompt.

Unlocking asks only when the key file is encrypted (the keystore calls the function it is given).
Creating a key encrypts it unless ``--insecure-unencrypted-key`` says this is a throwaway dev key;
with no passphrase source and no terminal to prompt on, creation stops with the three ways to give
one (docs/adr/0161). ``$DEKUBE_KEY_PASSPHRASE`` is taken out of the environment when the CLI starts
(``take_env_passphrase``), so nothing this process starts (a compute node's job subprocesses) inherits it.
"""
from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from pathlib import Path

from cli import keyring_store
from cli.errors import CliError

PASSPHRASE_ENV = "DEKUBE_KEY_PASSPHRASE"
MAX_PASSPHRASE_FILE_BYTES = 4096
_env_secret: bytes | None = None   # $DEKUBE_KEY_PASSPHRASE of this CLI run, no longer in os.environ


def take_env_passphrase() -> None:
    """Move ``$DEKUBE_KEY_PASSPHRASE`` from the environment into this module (a new CLI run: anything an
    earlier run in this process took is forgotten)."""
    global _env_secret
    value = os.environ.pop(PASSPHRASE_ENV, None)
    _env_secret = value.encode() if value else None


def add_unlock_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--passphrase-file", type=Path, default=None, metavar="FILE",
                        help=f"file whose first line is the key's passphrase (else ${PASSPHRASE_ENV}, "
                             "else a prompt; only asked for an encrypted key)")


def add_create_arguments(parser: argparse.ArgumentParser) -> None:
    add_unlock_argument(parser)
    parser.add_argument("--insecure-unencrypted-key", action="store_true",
                        help="write the key without encryption (throwaway dev networks only)")


def _from_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PASSPHRASE_FILE_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read passphrase file {path}: {exc.strerror}") from None
    if len(data) > MAX_PASSPHRASE_FILE_BYTES:
        raise CliError(f"passphrase file {path} is larger than {MAX_PASSPHRASE_FILE_BYTES} bytes")
    line = data.splitlines()[0] if data else b""
    if not line:
        raise CliError(f"passphrase file {path} is empty")
    return line


def _given(args: argparse.Namespace) -> bytes | None:
    path = getattr(args, "passphrase_file", None)
    if path is not None:
        return _from_file(path)
    if PASSPHRASE_ENV in os.environ:   # set after the CLI started (or used without cli.main)
        take_env_passphrase()
    return _env_secret


def given_elsewhere(args: argparse.Namespace) -> bool:
    """Whether a passphrase comes from ``--passphrase-file`` or the environment (no prompt, no keyring)."""
    return _given(args) is not None


def unlock_passphrase(args: argparse.Namespace, key_file: Path | None = None) -> Callable[[], bytes]:
    """A function giving the passphrase of an existing key (called only if the key is encrypted); with
    ``key_file``, the OS keyring's entry for it comes before the prompt."""
    def get() -> bytes:
        given = _given(args)
        if given is not None:
            return given
        stored = keyring_store.load(key_file) if key_file is not None else None
        if stored is not None:
            return stored
        if not sys.stdin.isatty():
            raise CliError(f"the key file is encrypted: give its passphrase with --passphrase-file FILE "
                           f"or ${PASSPHRASE_ENV} (no terminal to prompt on)")
        secret = getpass.getpass("key passphrase: ").encode()
        if not secret:
            raise CliError("no passphrase given")
        return secret
    return get


def new_key_passphrase(args: argparse.Namespace) -> bytes | None:
    """The passphrase to encrypt a new key with, or None for ``--insecure-unencrypted-key``."""
    if getattr(args, "insecure_unencrypted_key", False):
        return None
    given = _given(args)
    if given is not None:
        return given
    if not sys.stdin.isatty():
        raise CliError(f"a new key is encrypted with a passphrase: give one with --passphrase-file FILE "
                       f"or ${PASSPHRASE_ENV}, run in a terminal to be asked, or pass "
                       f"--insecure-unencrypted-key for a throwaway dev network")
    first = getpass.getpass("new key passphrase: ").encode()
    if not first:
        raise CliError("an empty passphrase encrypts nothing (use --insecure-unencrypted-key for a dev key)")
    if getpass.getpass("repeat the passphrase: ").encode() != first:
        raise CliError("the passphrases differ")
    return first

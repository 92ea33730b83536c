"""``dekube-node keys new|show|passwd``: create the node key (encrypted by default), show its peer ID
and public key, or re-encrypt it under a new passphrase (also turns a plaintext dev key into an
encrypted one)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.errors import CliError
from cli.home import add_home_argument, key_path, resolve_home
from cli.passphrase import add_create_arguments, add_unlock_argument, new_key_passphrase, unlock_passphrase
from node.identity import Identity
from node.keystore import load_identity, save_identity


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("keys", help="manage the node key")
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    new = actions.add_parser("new", help="create a new node key (refuses to replace one without --force)")
    add_home_argument(new)
    new.add_argument("--force", action="store_true", help="replace an existing key (the node gets a new peer ID)")
    add_create_arguments(new)
    new.set_defaults(handler=run_new)
    show = actions.add_parser("show", help="print the peer ID and public key")
    add_home_argument(show)
    show.add_argument("--json", action="store_true", help="print one JSON object")
    add_unlock_argument(show)
    show.set_defaults(handler=run_show)
    passwd = actions.add_parser("passwd", help="re-encrypt the key under a new passphrase (same peer ID)")
    add_home_argument(passwd)
    add_unlock_argument(passwd)
    passwd.add_argument("--new-passphrase-file", type=Path, default=None, metavar="FILE",
                        help="file whose first line is the new passphrase (else a prompt)")
    passwd.add_argument("--insecure-unencrypted-key", action="store_true",
                        help="write the key without encryption (throwaway dev networks only)")
    passwd.set_defaults(handler=run_passwd)


def run_new(args: argparse.Namespace) -> int:
    path = key_path(resolve_home(args))
    if path.exists() and not args.force:
        raise CliError(f"key file {path} already exists; refusing to overwrite it (use --force to replace the key)")
    passphrase = new_key_passphrase(args)
    identity = Identity.generate()
    save_identity(path, identity, overwrite=args.force, passphrase=passphrase)
    print(f"wrote {path} ({'encrypted' if passphrase is not None else 'NOT encrypted'})")
    print(f"peer ID: {identity.peer_id}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    path = key_path(resolve_home(args))
    identity = load_identity(path, unlock_passphrase(args))
    info = {"peer_id": identity.peer_id, "public_key": identity.public_key.hex(), "key_file": str(path)}
    if args.json:
        print(json.dumps(info))
    else:
        for name, value in info.items():
            print(f"{name + ':':12}{value}")
    return 0


def run_passwd(args: argparse.Namespace) -> int:
    path = key_path(resolve_home(args))
    identity = load_identity(path, unlock_passphrase(args))
    new_args = argparse.Namespace(passphrase_file=args.new_passphrase_file,
                                  insecure_unencrypted_key=args.insecure_unencrypted_key)
    passphrase = new_key_passphrase(new_args)
    save_identity(path, identity, overwrite=True, passphrase=passphrase)
    print(f"rewrote {path} ({'encrypted' if passphrase is not None else 'NOT encrypted'}); "
          f"peer ID unchanged: {identity.peer_id}")
    return 0

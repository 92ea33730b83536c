"""``dekube-node keys new|show``: create the node key, or show its peer ID and public key."""
from __future__ import annotations

import argparse
import json

from cli.home import add_home_argument, key_path, resolve_home
from node.identity import Identity
from node.keystore import load_identity, save_identity


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("keys", help="manage the node key")
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    new = actions.add_parser("new", help="create a new node key (refuses to replace one without --force)")
    add_home_argument(new)
    new.add_argument("--force", action="store_true", help="replace an existing key (the node gets a new peer ID)")
    new.set_defaults(handler=run_new)
    show = actions.add_parser("show", help="print the peer ID and public key")
    add_home_argument(show)
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(handler=run_show)


def run_new(args: argparse.Namespace) -> int:
    path = key_path(resolve_home(args))
    identity = Identity.generate()
    save_identity(path, identity, overwrite=args.force)
    print(f"wrote {path}")
    print(f"peer ID: {identity.peer_id}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    path = key_path(resolve_home(args))
    identity = load_identity(path)
    info = {"peer_id": identity.peer_id, "public_key": identity.public_key.hex(), "key_file": str(path)}
    if args.json:
        print(json.dumps(info))
    else:
        for name, value in info.items():
            print(f"{name + ':':12}{value}")
    return 0

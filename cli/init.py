"""``dekube-node init``: create a node home with config.toml and a new key (never overwrites
either without --force)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from cli.errors import CliError
from cli.home import add_home_argument, config_path, key_path, resolve_home
from cli.passphrase import add_create_arguments, new_key_passphrase
from node.config import load_config
from node.identity import Identity
from node.keystore import save_identity


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("init", help="create config.toml and a node key in the home directory")
    add_home_argument(parser)
    parser.add_argument("--role", help="roles to write into the config, e.g. validator,relay")
    parser.add_argument("--force", action="store_true", help="overwrite an existing config and key (new peer ID!)")
    add_create_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    home = resolve_home(args)
    config_file, key_file = config_path(home), key_path(home)
    existing = [str(p) for p in (config_file, key_file) if p.exists()]
    if existing and not args.force:
        raise CliError(f"{' and '.join(existing)} already exist; refusing to overwrite (use --force)")
    overrides = {("node", "roles"): args.role} if args.role else {}
    config = load_config(None, env={}, overrides=overrides)
    passphrase = new_key_passphrase(args)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    identity = Identity.generate()
    save_identity(key_file, identity, overwrite=args.force, passphrase=passphrase)
    _write_text_atomically(config_file, config.to_toml())
    print(f"initialized node home {home}")
    print(f"  config:  {config_file}")
    state = "encrypted" if passphrase is not None else "NOT encrypted: for throwaway dev networks only"
    print(f"  key:     {key_file} ({state}; keep it secret; back it up)")
    print(f"  peer ID: {identity.peer_id}")
    return 0


def _write_text_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

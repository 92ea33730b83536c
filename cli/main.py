"""``dekube-node``: the command line. Each subcommand lives in its own cli/*.py module that
exposes ``register(subparsers)``; adding one (testnet, wallet, task) is one line in SUBCOMMANDS.

User errors (bad config, unsafe or missing key, refused overwrite) print one line on stderr and
exit with status 1; argparse usage errors exit with 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from cli.assembly import install_product
from cli.errors import CliError
from cli.passphrase import take_env_passphrase
from cli.rpc_env import apply_rpc_default
from node.config import ConfigError
from node.extras import MissingExtra
from node.keystore import KeystoreError
from node.roles import RoleError

SUBCOMMANDS = (
    "cli.init",
    "cli.genesis",
    "cli.keys",
    "cli.start",
    "cli.status",
    "cli.testnet",
    "cli.wallet",
    "cli.task",
    "cli.artifact",
    "cli.serve",
    "cli.provide",
)
USER_ERRORS = (CliError, ConfigError, KeystoreError, MissingExtra, RoleError)


class VersionAction(argparse.Action):
    """``--version``: looks the version up only when asked (package metadata is slow to read)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, default: Any = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from node.runtime import node_version

        print(f"dekube-node {node_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dekube-node", description="dekube decentralized AI compute node")
    parser.add_argument("--version", action=VersionAction, help="show the version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMANDS:
        importlib.import_module(module_name).register(subparsers)
    apply_rpc_default(parser, os.environ)  # DEKUBE_RPC for every --rpc
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    take_env_passphrase()   # out of os.environ before anything can start a subprocess
    install_product()       # the roles, services and config sections the node is handed (ADR 0201)
    try:
        status: int = args.handler(args)
        return status
    except USER_ERRORS as exc:
        print(f"dekube-node: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

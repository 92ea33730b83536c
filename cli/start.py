"""``dekube-node start``: load config (file < env < flags) and key, then run the node until
SIGINT/SIGTERM."""
from __future__ import annotations

import argparse
import os

from cli.errors import CliError
from cli.home import add_home_argument, config_path, key_path, resolve_home
from cli.passphrase import add_unlock_argument, unlock_passphrase
from node.config import load_config
from node.keystore import load_identity
from node.logs import setup_logging
from node.roles import role_factory

# flag -> (section, key, help); list-valued keys accept repeated flags or commas.
FLAGS = {
    "--role": ("node", "roles", "roles to run, comma-separated: validator, relay, compute"),
    "--log-format": ("node", "log_format", "text or json"),
    "--log-level": ("node", "log_level", "debug, info, warning or error"),
    "--listen": ("p2p", "listen", "p2p listen multiaddr (repeatable)"),
    "--bootstrap": ("p2p", "bootstrap", "peer multiaddr to dial at start (repeatable)"),
    "--rpc-host": ("rpc", "host", "HTTP/JSON-RPC bind address"),
    "--rpc-port": ("rpc", "port", "HTTP/JSON-RPC port (0: any free port)"),
    "--chain-id": ("consensus", "chain_id", "chain identifier"),
}
_LIST_FLAGS = {"--listen", "--bootstrap"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("start", help="run the node")
    add_home_argument(parser)
    for flag, (section, key, text) in FLAGS.items():
        parser.add_argument(flag, dest=_dest(flag), action="append" if flag in _LIST_FLAGS else "store",
                            metavar=key.upper(), help=f"{text} (overrides [{section}] {key})")
    add_unlock_argument(parser)
    parser.add_argument("--verify-db", dest="verify_db", action="store_true",
                        help="read every block of the chain database at start-up to check it "
                             "(sets [consensus] verify_db = full; docs/adr/0142)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any config key, e.g. --set p2p.max_connections=64 (repeatable)")
    parser.set_defaults(handler=run)


def _dest(flag: str) -> str:
    return "flag_" + flag.lstrip("-").replace("-", "_")


def flag_overrides(args: argparse.Namespace) -> dict[tuple[str, str], str]:
    """The config overrides given on the command line, as text for the config parser."""
    overrides: dict[tuple[str, str], str] = {}
    for setting in args.settings:
        name, sep, value = setting.partition("=")
        section, dot, key = name.partition(".")
        if not sep or not dot or not section or not key:
            raise CliError(f"--set {setting!r}: expected SECTION.KEY=VALUE, e.g. rpc.port=8645")
        overrides[(section.strip(), key.strip())] = value
    for flag, (section, key, _) in FLAGS.items():
        value = getattr(args, _dest(flag))
        if value is not None:
            overrides[(section, key)] = ",".join(value) if isinstance(value, list) else value
    if getattr(args, "verify_db", False):
        overrides[("consensus", "verify_db")] = "full"
    return overrides


def run(args: argparse.Namespace) -> int:
    home = resolve_home(args)
    config_file = config_path(home)
    config = load_config(config_file, env=os.environ, overrides=flag_overrides(args))
    role_names = config.get("node", "roles")
    if not role_names:
        raise CliError(f"no role to run: pass --role validator|relay|compute or set [node] roles in {config_file}")
    identity = load_identity(key_path(home), unlock_passphrase(args))
    setup_logging(config.get("node", "log_format"), config.get("node", "log_level"))
    roles = [role_factory(name) for name in role_names]  # an unknown role or missing extra: before starting
    from node.runtime import Node, run_node  # aiohttp and the p2p stack: not for --help

    return run_node(lambda: Node(config, identity, roles, home=home))

"""``dekube-node start``: load config (file < env < flags) and key, then run the node until
SIGINT/SIGTERM.

``--dev`` runs a one-validator development chain (like ``geth --dev``): the home (default
``~/.dekube-dev``) gets a config, a node key, a genesis and a funded ``dev_key.json`` the first time
(cli/dev_chain.py). ``--genesis FILE`` joins an existing network: the file is copied into the home
and its chain id used; with ``--bootstrap`` peers the validator role syncs blocks from the committee.
A validator without a genesis stops before starting, with the commands that make one.
A node with the compute role applies the portable CPU profile's kernel settings before torch loads
(docs/adr/0166; ``[compute] portable_cpu = false`` keeps the machine's fastest kernels).
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from cli.dev_chain import DEV_HOME, prepare_dev_home
from cli.errors import CliError
from cli.genesis import read_genesis
from cli.home import HOME_ENV, add_home_argument, config_path, key_path, resolve_home
from cli.passphrase import add_unlock_argument, unlock_passphrase
from consensus.genesis import Genesis
from ml.profiles import apply_portable_cpu_env
from node.config import load_config
from node.keystore import load_identity
from node.logs import setup_logging
from node.roles import role_factory

log = logging.getLogger(__name__)

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
    parser.add_argument("--dev", action="store_true",
                        help=f"run a one-validator dev chain; makes the home (default {DEV_HOME}) with a genesis "
                             "and a funded dev key the first time")
    parser.add_argument("--genesis", type=Path, metavar="FILE",
                        help="the network's genesis file: copied into the home, its chain id used (join a network "
                             "with --genesis FILE --bootstrap MULTIADDR)")
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


def run(args: argparse.Namespace, unlock=None) -> int:
    """Start the node; ``unlock`` gives the key's passphrase where the caller already has it (``provide``)."""
    overrides = flag_overrides(args)
    if args.dev:
        if args.genesis is not None:
            raise CliError("--dev makes its own genesis; leave out --genesis")
        home = (args.home or (Path(os.environ[HOME_ENV]) if os.environ.get(HOME_ENV) else DEV_HOME)).expanduser()
        for line in prepare_dev_home(home, overrides):
            print(line, flush=True)
    else:
        home = resolve_home(args)
    config_file = config_path(home)
    genesis = read_genesis(args.genesis.expanduser()) if args.genesis is not None else None
    if genesis is not None:
        overrides.setdefault(("consensus", "chain_id"), genesis.chain_id)
    config = load_config(config_file, env=os.environ, overrides=overrides)
    if genesis is not None:
        install_genesis(genesis, args.genesis, home / config.get("consensus", "genesis_file"))
    role_names = config.get("node", "roles")
    if not role_names:
        raise CliError(f"no role to run: pass --role validator|relay|compute or set [node] roles in {config_file}")
    genesis_file = home / config.get("consensus", "genesis_file")
    if "validator" in role_names and not genesis_file.exists():
        raise CliError(f"the validator role needs the chain's genesis and {genesis_file} is missing: pass "
                       "--genesis FILE to join a network, make one with 'dekube-node genesis new', "
                       "or run 'dekube-node start --dev' for a local dev chain")
    identity = load_identity(key_path(home), unlock or unlock_passphrase(args, key_path(home)))
    setup_logging(config.get("node", "log_format"), config.get("node", "log_level"))
    apply_compute_profile(config, role_names, os.environ)   # before any role imports torch
    roles = [role_factory(name) for name in role_names]  # an unknown role or missing extra: before starting
    from node.runtime import Node, run_node  # aiohttp and the p2p stack: not for --help

    return run_node(lambda: Node(config, identity, roles, home=home))


def apply_compute_profile(config, role_names: list[str], environ) -> bool:
    """A node that computes trains under the portable CPU profile (docs/adr/0166) unless its operator set
    ``[compute] portable_cpu = false``: the profile's kernel settings go into ``environ`` here, before
    the compute role imports torch (torch, MKL and oneDNN read them when they load). True if applied."""
    if "compute" not in role_names or not config.get("compute", "portable_cpu"):
        return False
    if not apply_portable_cpu_env(environ):
        log.warning("torch was loaded before the portable CPU profile was applied: this process will not "
                    "offer the profile")
    return True


def install_genesis(genesis: Genesis, source: Path, target: Path) -> None:
    """Copy ``genesis`` (read from ``source``) to ``target`` in the home, refusing to replace a different one."""
    if target.exists():
        current = read_genesis(target)
        if current.hash != genesis.hash:
            raise CliError(f"{target} holds another genesis (chain {current.chain_id!r}, hash "
                           f"{current.hash.hex()[:16]}...) than {source}; this home belongs to that chain")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(genesis.to_json() + "\n", encoding="utf-8")

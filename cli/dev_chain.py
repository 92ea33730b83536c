"""The home of ``dekube-node start --dev``: a one-validator development chain, like ``geth --dev``.

The first start writes ``config.toml`` (role validator, p2p on 127.0.0.1:4001, RPC on
127.0.0.1:8645, chain id ``dekube-dev``), the node key, a genesis where this node is the only
validator, and ``dev_key.json``, an account holding 10^15 for wallets and task submissions. Later
starts reuse them (the chain goes on). A home that holds a node but no dev key is refused, so
``--dev`` never writes a dev genesis into a real node's home.
"""
from __future__ import annotations

import os
from pathlib import Path

from cli.errors import CliError
from cli.genesis import dev_genesis, write_genesis
from cli.home import config_path, key_path
from node.config import load_config
from node.identity import Identity
from node.keystore import load_identity, save_identity

DEV_HOME = Path("~/.dekube-dev")
DEV_KEY = "dev_key.json"
DEV_CHAIN_ID = "dekube-dev"
DEV_LISTEN = "/ip4/127.0.0.1/tcp/4001"
DEV_FUNDS = 10**15


def prepare_dev_home(home: Path, overrides: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Make the dev chain's home if it is not there yet; return the lines to print (``overrides``: the
    command line's config overrides, for the RPC address shown)."""
    home = home.expanduser()
    dev_key = home / DEV_KEY
    config_file, node_key = config_path(home), key_path(home)
    fresh = not dev_key.exists()
    if fresh:
        if config_file.exists() or node_key.exists():
            raise CliError(f"{home} holds a node that is not a dev chain (no {DEV_KEY}); "
                           "pick another directory with --home")
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        validator, dev = Identity.generate(), Identity.generate()
        listen = (overrides or {}).get(("p2p", "listen"), DEV_LISTEN).split(",")[0]
        config = load_config(None, env={}, overrides={
            ("node", "roles"): "validator",
            ("p2p", "listen"): listen,
            ("rpc", "host"): "127.0.0.1",
            ("consensus", "chain_id"): DEV_CHAIN_ID,
        })
        write_genesis(home / config.get("consensus", "genesis_file"),
                      dev_genesis(validator, dev, f"{listen}/p2p/{validator.peer_id}",
                                  chain_id=DEV_CHAIN_ID, funds=DEV_FUNDS))
        save_identity(node_key, validator)
        save_identity(dev_key, dev)
        tmp = config_file.with_name(f".{config_file.name}.tmp-{os.getpid()}")
        tmp.write_text(config.to_toml(), encoding="utf-8")
        os.replace(tmp, config_file)
    dev = load_identity(dev_key)
    config = load_config(config_file, env=os.environ, overrides=overrides)
    host = config.get("rpc", "host")
    rpc = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{config.get('rpc', 'port')}"
    return [
        f"{'created' if fresh else 'using'} dev chain {config.get('consensus', 'chain_id')!r} in {home}",
        f"  dev account: {dev.peer_id} (funded with {DEV_FUNDS} at genesis)",
        f"  dev key:     {dev_key}",
        f"  try: dekube-node wallet balance --rpc {rpc} --key {dev_key}",
    ]

"""``dekube-node genesis new|add-validator|add-account|show``: write the genesis of a real network.

A network's founders agree on one genesis file: one of them runs ``genesis new``, each validator
runs ``genesis add-validator --home THEIR_HOME --addr THEIR_PUBLIC_MULTIADDR`` on it in turn (or
sends their peer ID and address), funded accounts are added with ``add-account``, and ``show``
prints what is in it and its hash, which every operator compares before starting. Every command
validates the whole document (consensus.genesis) before it writes, and writes atomically.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from cli.errors import CliError
from cli.home import key_path
from cli.passphrase import unlock_passphrase
from cli.safe_text import safe
from consensus.genesis import Genesis, GenesisError, GenesisValidator, Params
from node.config import check_peer_multiaddr
from node.identity import Identity, is_valid_peer_id
from node.keystore import load_identity

DEFAULT_FILE = Path("genesis.json")
DEFAULT_STAKE = 1_000_000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("genesis", help="make or inspect the genesis file of a network")
    actions = parser.add_subparsers(dest="genesis_command", required=True, metavar="ACTION")
    new = actions.add_parser("new", help="write a genesis with no validators yet")
    new.add_argument("--chain-id", required=True, help="the network's chain id (1..64 characters)")
    new.add_argument("--param", action="append", default=[], metavar="NAME=INT",
                     help="chain parameter override, e.g. --param committee_size=7 (repeatable)")
    new.add_argument("--force", action="store_true", help="overwrite an existing file")
    add = actions.add_parser("add-validator", help="add a bonded validator (and fund its account)")
    who = add.add_mutually_exclusive_group(required=True)
    who.add_argument("--home", type=Path, help="the validator's node home (its node_key.json gives the peer ID)")
    who.add_argument("--peer-id", help="the validator's peer ID (12D3KooW...)")
    add.add_argument("--addr", action="append", default=[], metavar="MULTIADDR",
                     help="where other validators reach it: /ip4|dns4/HOST/tcp/PORT[/p2p/ID] (repeatable)")
    add.add_argument("--stake", type=int, default=DEFAULT_STAKE, help=f"bonded stake (default {DEFAULT_STAKE})")
    add.add_argument("--balance", type=int, default=0, help="liquid balance for its fees (default 0)")
    fund = actions.add_parser("add-account", help="give an account a starting balance")
    fund.add_argument("peer_id", help="the account's peer ID")
    fund.add_argument("amount", type=int)
    show = actions.add_parser("show", help="print the chain id, validators, balances and hash")
    show.add_argument("--json", action="store_true", help="print the whole document and its hash as JSON")
    for sub, handler in ((new, run_new), (add, run_add_validator), (fund, run_add_account), (show, run_show)):
        sub.add_argument("--genesis", type=Path, default=DEFAULT_FILE, metavar="FILE",
                         help=f"the genesis file (default ./{DEFAULT_FILE})")
        sub.set_defaults(handler=handler)


# ---------------------------------------------------------------- reading and writing


def read_genesis(path: Path) -> Genesis:
    try:
        return Genesis.from_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"cannot read genesis {path}: {exc.strerror or exc}") from None
    except GenesisError as exc:
        raise CliError(f"genesis {path} is invalid: {exc}") from None


def write_genesis(path: Path, genesis: Genesis, *, overwrite: bool = True) -> None:
    if path.exists() and not overwrite:
        raise CliError(f"{path} already exists; refusing to overwrite (use --force)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(genesis.to_json() + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _replace(genesis: Genesis, **changes: Any) -> Genesis:
    try:
        return dataclasses.replace(genesis, **changes)
    except GenesisError as exc:
        raise CliError(str(exc)) from None


def parse_params(items: list[str]) -> Params:
    known = {f.name for f in dataclasses.fields(Params)}
    values: dict[str, int] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in known:
            raise CliError(f"--param {item!r}: expected NAME=INT with NAME one of {', '.join(sorted(known))}")
        try:
            values[name] = int(text)
        except ValueError:
            raise CliError(f"--param {item!r}: {text!r} is not an integer") from None
    try:
        params = Params(**values)
        params.validate()
    except GenesisError as exc:
        raise CliError(f"--param: {exc}") from None
    return params


def dev_genesis(validator: Identity, dev_account: Identity, listen_addr: str, *, chain_id: str,
                funds: int = 10**15) -> Genesis:
    """A one-validator chain where ``dev_account`` holds ``funds`` (``start --dev``)."""
    return Genesis(chain_id, int(time.time() * 1000),
                   {dev_account.peer_id: funds, validator.peer_id: 10**9},
                   (GenesisValidator(validator.peer_id, DEFAULT_STAKE, (listen_addr,)),),
                   Params(committee_size=1))


# ---------------------------------------------------------------- commands


def run_new(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    try:
        genesis = Genesis(args.chain_id, int(time.time() * 1000), {}, (), params)
    except GenesisError as exc:
        raise CliError(str(exc)) from None
    write_genesis(args.genesis, genesis, overwrite=args.force)
    print(f"wrote {args.genesis} for chain {genesis.chain_id!r}; "
          f"next: dekube-node genesis add-validator --genesis {args.genesis} --home HOME --addr MULTIADDR")
    return 0


def run_add_validator(args: argparse.Namespace) -> int:
    genesis = read_genesis(args.genesis)
    peer_id = (load_identity(key_path(args.home.expanduser()), unlock_passphrase(args)).peer_id if args.home
               else args.peer_id)
    if not is_valid_peer_id(peer_id):
        raise CliError(f"{peer_id!r} is not a peer ID")
    if any(v.peer_id == peer_id for v in genesis.validators):
        raise CliError(f"{peer_id} is already a validator in {args.genesis}")
    if args.balance < 0:
        raise CliError("--balance must not be negative")
    addrs = []
    for addr in args.addr:
        if "/p2p/" not in addr:
            addr = f"{addr.rstrip('/')}/p2p/{peer_id}"
        try:
            check_peer_multiaddr(addr)
        except ValueError as exc:
            raise CliError(f"--addr: {exc}") from None
        if not addr.endswith(f"/p2p/{peer_id}"):
            raise CliError(f"--addr {addr} names another peer than {peer_id}")
        addrs.append(addr)
    if not addrs:
        print("note: no --addr given; other validators will only find this one through --bootstrap peers")
    if args.stake < genesis.params.min_validator_stake:
        raise CliError(f"--stake {args.stake} is below min_validator_stake {genesis.params.min_validator_stake}")
    balances = dict(genesis.balances)
    if args.balance:
        balances[peer_id] = balances.get(peer_id, 0) + args.balance
    genesis = _replace(genesis, balances=balances,
                       validators=(*genesis.validators, GenesisValidator(peer_id, args.stake, tuple(addrs))))
    write_genesis(args.genesis, genesis)
    print(f"added validator {peer_id} (stake {args.stake}); {len(genesis.validators)} validator(s) in {args.genesis}")
    return 0


def run_add_account(args: argparse.Namespace) -> int:
    genesis = read_genesis(args.genesis)
    if not is_valid_peer_id(args.peer_id):
        raise CliError(f"{args.peer_id!r} is not a peer ID")
    if args.amount <= 0:
        raise CliError("the amount must be positive")
    balances = dict(genesis.balances)
    balances[args.peer_id] = balances.get(args.peer_id, 0) + args.amount
    write_genesis(args.genesis, _replace(genesis, balances=balances))
    print(f"{args.peer_id} now holds {balances[args.peer_id]} in {args.genesis}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    genesis = read_genesis(args.genesis)
    if args.json:
        print(json.dumps({"hash": genesis.hash.hex(), "genesis": genesis.to_obj()}, indent=2, sort_keys=True))
        return 0
    print(safe(f"chain id:     {genesis.chain_id}"))
    print(f"hash:         {genesis.hash.hex()}")
    print(f"total supply: {genesis.total_supply}")
    print(f"validators:   {len(genesis.validators)} (committee size {genesis.params.committee_size})")
    for v in genesis.validators:
        print(safe(f"  {v.peer_id}  stake {v.stake}  {' '.join(v.listen_addrs) or '(no address)'}"))
    print(f"accounts:     {len(genesis.balances)}")
    for peer_id, amount in sorted(genesis.balances.items()):
        print(f"  {peer_id}  {amount}")
    if not genesis.validators:
        print("warning: no validators yet; a chain needs at least one (genesis add-validator)")
    return 0

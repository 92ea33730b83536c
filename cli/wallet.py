"""``dekube-node wallet balance|nonce|send|bond|unbond``: sign locally with a key file, talk JSON-RPC.

The key is the node's (``<home>/node_key.json``) unless ``--key FILE`` names another (e.g. the
testnet faucet). The chain id and the next nonce (``pending``) come from the node at ``--rpc``;
``--wait`` polls for the receipt and fails unless the transaction executed successfully.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.errors import CliError
from cli.home import add_home_argument, key_path, resolve_home
from cli.passphrase import add_unlock_argument, unlock_passphrase
from cli.rpc_call import rpc_call
from cli.safe_text import echo
from cli.tx_sender import send_tx_blocking
from consensus.tx import DEFAULT_FEE
from node.identity import Identity, is_valid_peer_id
from node.keystore import load_identity

DEFAULT_RPC = "http://127.0.0.1:8645"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("wallet", help="balances and signed transactions over JSON-RPC")
    actions = parser.add_subparsers(dest="wallet_command", required=True, metavar="ACTION")

    def action(name: str, help_text: str, handler) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help_text)
        add_home_argument(sub)
        sub.add_argument("--rpc", default=DEFAULT_RPC, help=f"node JSON-RPC URL (default {DEFAULT_RPC})")
        sub.add_argument("--key", type=Path, help="key file to use instead of <home>/node_key.json")
        add_unlock_argument(sub)
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.set_defaults(handler=handler)
        return sub

    balance = action("balance", "show free, bonded and unbonding tokens of an address", run_balance)
    balance.add_argument("address", nargs="?", help="peer ID (default: the key's)")
    nonce = action("nonce", "show the next nonce (latest and pending)", run_nonce)
    nonce.add_argument("address", nargs="?", help="peer ID (default: the key's)")
    send = action("send", "transfer tokens", run_send)
    send.add_argument("to", help="recipient peer ID")
    send.add_argument("amount", type=int)
    for name, text in (("bond", "bond stake (become or strengthen a validator)"),
                       ("unbond", "start unbonding stake")):
        sub = action(name, text, run_stake)
        sub.add_argument("amount", type=int)
    action("unjail", "ask to be a validator candidate again after a jailing (ADR 0165)", run_unjail)
    for name, text in (("serve-deposit", "move tokens into your serving escrow (pays block servers, ADR 0174)"),
                       ("serve-withdraw", "take tokens back from an unlocked serving escrow")):
        sub = action(name, text, run_serve_escrow)
        sub.add_argument("amount", type=int)
    action("serve-unlock", "start unlocking your serving escrow (servers may claim until it matures)",
           run_serve_escrow)
    escrow = action("serve-escrow", "show a serving escrow (balance, unlock height)", run_show_escrow)
    escrow.add_argument("address", nargs="?", help="peer ID (default: the key's)")
    for sub in (send, *(actions.choices[n] for n in ("bond", "unbond", "unjail", "serve-deposit", "serve-withdraw",
                                                      "serve-unlock"))):
        sub.add_argument("--fee", type=int, default=DEFAULT_FEE,
                         help=f"fee paid to the block proposer (default {DEFAULT_FEE})")
        sub.add_argument("--wait", action="store_true", help="wait for the receipt (fail unless it succeeded)")
        sub.add_argument("--timeout", type=float, default=30.0, help="seconds --wait waits (default 30)")


def _identity(args: argparse.Namespace) -> Identity:
    return load_identity(args.key or key_path(resolve_home(args)), unlock_passphrase(args))


def _address(args: argparse.Namespace) -> str:
    address = args.address or _identity(args).peer_id
    if not is_valid_peer_id(address):
        raise CliError(f"{address!r} is not a valid peer ID")
    return address


def _rpc(args: argparse.Namespace, method: str, *params):
    return rpc_call(args.rpc, method, *params)


def _print(args: argparse.Namespace, doc: dict) -> None:
    if args.json:
        print(json.dumps(doc))
    else:
        for name, value in doc.items():
            echo(f"{name + ':':10}{value}")


def run_balance(args: argparse.Namespace) -> int:
    """Free (spendable; also as "balance"), bonded and unbonding stake (with the heights each part returns
    at), and their total."""
    address = _address(args)
    stake = _rpc(args, "dkb_getStake", address)
    free = _rpc(args, "dkb_getBalance", address)
    releases = [[int(height), int(amount)] for height, amount in stake.get("unbonding") or []]
    unbonding = sum(amount for _, amount in releases)
    doc = {"address": address, "free": free, "bonded": stake["bonded"], "unbonding": unbonding,
           "total": free + stake["bonded"] + unbonding, "height": _rpc(args, "dkb_blockNumber")}
    if args.json:
        print(json.dumps({**doc, "balance": free, "unbonding_releases": releases}))
        return 0
    if releases:
        doc["unbonding"] = f"{unbonding} (" + ", ".join(f"{a} at height {h}" for h, a in releases) + ")"
    _print(args, doc)
    return 0


def run_nonce(args: argparse.Namespace) -> int:
    address = _address(args)
    _print(args, {"address": address, "latest": _rpc(args, "dkb_getTransactionCount", address, "latest"),
                  "pending": _rpc(args, "dkb_getTransactionCount", address, "pending")})
    return 0


def run_send(args: argparse.Namespace) -> int:
    if not is_valid_peer_id(args.to):
        raise CliError(f"recipient {args.to!r} is not a valid peer ID")
    return _submit(args, "transfer", {"to": args.to, "amount": _positive(args.amount)})


def run_stake(args: argparse.Namespace) -> int:
    return _submit(args, args.wallet_command, {"amount": _positive(args.amount)})


def run_serve_escrow(args: argparse.Namespace) -> int:
    tx_type = args.wallet_command.replace("-", "_")
    return _submit(args, tx_type, {} if tx_type == "serve_unlock" else {"amount": _positive(args.amount)})


def run_show_escrow(args: argparse.Namespace) -> int:
    address = _address(args)
    _print(args, _rpc(args, "dkb_getServeEscrow", address))
    return 0


def run_unjail(args: argparse.Namespace) -> int:
    return _submit(args, "unjail", {})


def _positive(amount: int) -> int:
    if amount <= 0:
        raise CliError("amount must be positive")
    return amount


def _submit(args: argparse.Namespace, tx_type: str, payload: dict) -> int:
    identity = _identity(args)
    sent = send_tx_blocking(args.rpc, identity, tx_type, payload, fee=args.fee, timeout=args.timeout, wait=args.wait)
    doc = {"tx_hash": sent.tx_hash, "from": identity.peer_id, "nonce": sent.nonce, "type": tx_type}
    if sent.receipt is not None:
        doc.update(height=sent.receipt["height"], status=sent.receipt["status"])
    _print(args, doc)
    return 0

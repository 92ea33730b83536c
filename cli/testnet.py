"""``dekube-node testnet up|down|status``: a local multi-validator chain on 127.0.0.1.

``up`` creates the testnet in ``--home`` (default ``./testnet``) unless one is there, starts every
validator in the background, waits until blocks are produced and prints the RPC endpoints and the
faucet key (``--json``: one JSON object on stdout, progress on stderr). ``--validators 1`` makes a
single-validator chain. ``down`` stops them (SIGTERM, SIGKILL after ``--timeout``). ``status`` shows pid and
height per node.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cli.errors import CliError
from devtools.devnet import COMPUTE_MANIFEST, ComputeDevnet
from devtools.testnet import MANIFEST, Testnet, TestnetError
from node.extras import require_compute

DEFAULT_HOME = Path("testnet")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("testnet", help="run a local multi-validator testnet")
    actions = parser.add_subparsers(dest="testnet_command", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="create (if needed) and start the testnet")
    up.add_argument("--validators", type=int, default=4, help="validators in a new testnet, 1..100 (default 4)")
    up.add_argument("--chain-id", default="dekube-testnet", help="chain id of a new testnet")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the first blocks")
    up.add_argument("--compute", type=int, default=0,
                    help="also start this many funded compute nodes that train, audit and get paid for tasks")
    up.add_argument("--base-port", type=int, default=0,
                    help="validator I uses p2p port BASE+2I and RPC port BASE+2I+1 (default: free ports)")
    up.add_argument("--json", action="store_true",
                    help="print one JSON object (chain id, nodes, faucet key) on stdout; progress goes to stderr")
    down = actions.add_parser("down", help="stop every validator")
    down.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGKILL (default 10)")
    status = actions.add_parser("status", help="pid and height of every validator")
    status.add_argument("--json", action="store_true", help="print JSON")
    for sub, handler in ((up, run_up), (down, run_down), (status, run_status)):
        sub.add_argument("--home", type=Path, default=DEFAULT_HOME,
                         help=f"testnet directory (default ./{DEFAULT_HOME})")
        sub.set_defaults(handler=handler)


def _guard(fn):
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except TestnetError as exc:
            raise CliError(str(exc)) from None
    return run


@_guard
def run_up(args: argparse.Namespace) -> int:
    home = args.home.expanduser().resolve()
    out = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    devnet = None
    if (home / COMPUTE_MANIFEST).exists():
        require_compute("a testnet with compute nodes")
        devnet = ComputeDevnet.load(home)
        testnet = devnet.testnet
        say(f"starting the existing testnet in {home}")
    elif (home / MANIFEST).exists():
        testnet = Testnet.load(home)
        say(f"starting the existing testnet in {home}")
    else:
        if not 1 <= args.validators <= 100:
            raise CliError("--validators must be in 1..100")
        if not 0 <= args.compute <= 64:
            raise CliError("--compute must be in 0..64")
        if args.compute:
            require_compute("testnet up --compute")
            devnet = ComputeDevnet.create(home, args.validators, args.compute, chain_id=args.chain_id)
            testnet = devnet.testnet
        else:
            testnet = Testnet.create(home, args.validators, chain_id=args.chain_id, base_port=args.base_port)
        say(f"created a {args.validators}-validator testnet in {home}"
            + (f" with {args.compute} compute nodes" if args.compute else ""))
    if devnet is not None:
        devnet.up(timeout=max(args.timeout, 120.0))
    else:
        testnet.up(wait_height=1, timeout=args.timeout)
    compute = list(devnet.compute) if devnet is not None else []
    if args.json:
        print(json.dumps({
            "chain_id": testnet.chain_id, "home": str(home),
            "faucet_key": str(testnet.faucet_key), "faucet": testnet.faucet().peer_id,
            "validators": [{"name": n.name, "peer_id": n.peer_id, "rpc": n.rpc_url, "p2p": n.p2p_addr,
                            "log": str(n.log_file)} for n in testnet.nodes],
            "compute": [{"name": n.name, "peer_id": n.peer_id, "rpc": n.rpc_url, "log": str(n.log_file)}
                        for n in compute],
            **({"explorer": devnet.explorer_url()} if devnet is not None else {}),
        }))
        return 0
    print(f"chain {testnet.chain_id}: producing blocks")
    for node in testnet.nodes:
        print(f"  {node.name}  rpc {node.rpc_url}  p2p {node.p2p_addr}  log {node.log_file}")
    for node in compute:
        print(f"  {node.name}  rpc {node.rpc_url}  compute node {node.peer_id}  log {node.log_file}")
    print(f"explorer: {devnet.explorer_url() if devnet is not None else testnet.nodes[0].rpc_url + '/explorer/'}")
    print(f"faucet key: {testnet.faucet_key} ({testnet.faucet().peer_id})")
    print(f"try: dekube-node wallet balance --rpc {testnet.nodes[0].rpc_url} --key {testnet.faucet_key}")
    return 0


@_guard
def run_down(args: argparse.Namespace) -> int:
    home = args.home.expanduser()
    network = ComputeDevnet.load(home) if (home / COMPUTE_MANIFEST).exists() else Testnet.load(home)
    stopped = network.down(args.timeout)
    print(f"stopped {', '.join(stopped)}" if stopped else "no node was running")
    return 0


@_guard
def run_status(args: argparse.Namespace) -> int:
    home = args.home.expanduser()
    if (home / COMPUTE_MANIFEST).exists():
        require_compute("a testnet with compute nodes")
        devnet = ComputeDevnet.load(home)
        rows = devnet.testnet.status(devnet.compute)
    else:
        rows = Testnet.load(home).status()
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        if not row["pid"]:
            state = "stopped"
        else:
            state = f"pid {row['pid']}  " + (f"height {row['height']}" if row["height"] is not None else "running")
        print(f"{row['name']:4} {state:28} {row['rpc']}")
    return 0

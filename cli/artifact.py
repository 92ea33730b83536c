"""``dekube-node artifact``: add files to the node's artifact store, list it, fetch from peers.

``add PATH`` copies the file into ``<home>/data/artifacts`` and prints its id (the store is plain
files, so this works while the node runs; the running node serves it at once). ``ls`` lists what
the store holds, partial downloads included. ``get ID --out PATH --from MULTIADDR [--from ...]``
starts a client node (cli/client_node.py), downloads from every holder named at once with a
progress bar, and writes the verified file to PATH.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from pathlib import Path

from cli.errors import CliError
from cli.home import add_home_argument, key_path, resolve_home
from node.artifacts import ArtifactError, ArtifactStore, check_id
from node.artifacts.quota import StoreQuota
from node.config import CONFIG_FILE_NAME, load_config
from node.identity import Identity
from node.keystore import load_identity
from node.p2p.multiaddr import Multiaddr, MultiaddrError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("artifact", help="add, list and fetch content-addressed artifacts")
    actions = parser.add_subparsers(dest="artifact_command", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a file to the node's artifact store and print its id")
    add.add_argument("path", type=Path)
    add_home_argument(add)
    add.set_defaults(handler=run_add)
    ls = actions.add_parser("ls", help="list the artifacts in the node's store")
    ls.add_argument("--json", action="store_true", help="print JSON")
    add_home_argument(ls)
    ls.set_defaults(handler=run_ls)
    get = actions.add_parser("get", help="download an artifact from peers that hold it")
    get.add_argument("id")
    get.add_argument("--out", type=Path, required=True, help="where to write the file")
    get.add_argument("--from", dest="holders", action="append", required=True, metavar="MULTIADDR",
                     help="a holder's multiaddr ending in /p2p/<peer id> (repeat for several holders)")
    get.add_argument("--relay", action="append", default=[], metavar="MULTIADDR",
                     help="a relay to reserve on (only needed to be reachable yourself)")
    get.add_argument("--key", type=Path, help="node key to use (default: <home>/node_key.json if any, else a "
                                              "fresh identity)")
    get.add_argument("--quiet", action="store_true", help="no progress bar")
    add_home_argument(get)
    get.set_defaults(handler=run_get)


def _store(args: argparse.Namespace) -> ArtifactStore:
    home = resolve_home(args)
    config_file = home / CONFIG_FILE_NAME
    config = load_config(config_file if config_file.exists() else None, env={})
    root, section = home / "data" / "artifacts", config["artifacts"]
    quota = StoreQuota(root, max(section["quota_mb"], section["max_size_mb"]) << 20, section["own_retention_s"])
    return ArtifactStore(root, section["max_size_mb"] << 20, quota)


def run_add(args: argparse.Namespace) -> int:
    try:
        artifact = _store(args).add_file(args.path)
    except ArtifactError as exc:
        raise CliError(str(exc)) from None
    print(artifact)
    return 0


def run_ls(args: argparse.Namespace) -> int:
    items = _store(args).list()
    if args.json:
        print(json.dumps(items))
        return 0
    for item in items:
        state = "complete" if item["complete"] else f"partial {item['have']}/{item['chunks']} chunks"
        print(f"{item['id']}  {item['size']:>14,d}  {state}")
    return 0


def run_get(args: argparse.Namespace) -> int:
    try:
        artifact = check_id(args.id)
        holders = [Multiaddr.parse(addr) for addr in args.holders]
    except (ValueError, MultiaddrError) as exc:
        raise CliError(str(exc)) from None
    if any(addr.peer_id is None for addr in holders):
        raise CliError("each --from address needs a /p2p/<peer id> suffix")
    home = resolve_home(args)
    key = args.key or key_path(home)
    identity = load_identity(key) if args.key or key.exists() else Identity.generate()
    try:
        asyncio.run(_get(identity, artifact, holders, args.relay, args.out, args.quiet))
    except ArtifactError as exc:
        raise CliError(str(exc)) from None
    return 0


async def _get(identity: Identity, artifact: str, holders: list[Multiaddr], relays: list[str], out: Path,
               quiet: bool) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from cli.client_node import client_node

    async with client_node(identity, relays=relays) as node:
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TimeRemainingColumn(), disable=quiet, transient=False) as bar:
            task = bar.add_task(artifact[:16], total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            report = await node.artifacts.fetch_report(artifact, [str(a) for a in holders], progress=progress)
        for peer in report.bad_holders:
            print(f"warning: holder {peer} served bad data and was dropped", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copyfile, report.path, out)
    if not quiet:
        print(f"{artifact} -> {out} ({report.size} bytes, {report.received_bytes} fetched in "
              f"{report.seconds:.1f} s)", file=sys.stderr)

"""``dekube-node status``: ask a running node (its [rpc] address from the config, or --url) for
/status and print it."""
from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request

from cli.errors import CliError
from cli.home import add_home_argument, config_path, resolve_home
from node.config import load_config

TIMEOUT_S = 5.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("status", help="show a running node's /status")
    add_home_argument(parser)
    parser.add_argument("--url", help="node HTTP address, e.g. http://127.0.0.1:8645 (default: from the config)")
    parser.set_defaults(handler=run)


def node_url(args: argparse.Namespace) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    config = load_config(config_path(resolve_home(args)), env=os.environ)
    host = config.get("rpc", "host")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{config.get('rpc', 'port')}"


def run(args: argparse.Namespace) -> int:
    url = node_url(args) + "/status"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            status = json.loads(response.read())
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"no node answering at {url}: {reason} (is 'dekube-node start' running?)") from None
    except ValueError:
        raise CliError(f"{url} did not return JSON; is that a dekube node?") from None
    print(json.dumps(status, indent=2))
    return 0

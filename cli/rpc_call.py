"""One JSON-RPC call from a CLI command: the node's client (node/ledger/jsonrpc.py), its failures
turned into one-line ``CliError``s (the node unreachable, or the node's error answer)."""
from __future__ import annotations

from typing import Any

from cli.errors import CliError
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError


def rpc_call(url: str, method: str, *params: Any, name_url: bool = False) -> Any:
    """``method(*params)`` at ``url``; ``name_url``: the errors say which URL (a network's RPC the user
    did not type, e.g. a bootstrap peer's)."""
    try:
        return jsonrpc.call(url, method, *params)
    except LedgerUnavailable as exc:
        where = f"the network's RPC {url}" if name_url else "the node"
        raise CliError(f"cannot reach {where}: {exc}") from None
    except RpcAnswerError as exc:
        raise CliError(f"{method}{f' at {url}' if name_url else ''}: {exc}") from None

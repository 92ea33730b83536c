"""A minimal blocking JSON-RPC 2.0 client over HTTP (stdlib only), for the wallet, testnet and checks.

``call(url, method, *params)`` returns the result or raises ``RpcCallError`` (the server's error
object: ``code``, ``message``, ``data``) or ``RpcUnreachable`` (connection or HTTP failure).
``batch(url, [(method, params), ...])`` sends one batch and returns results or ``RpcCallError``
instances in request order.
"""
from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from typing import Any

_ids = itertools.count(1)


class RpcUnreachable(ConnectionError):
    """The node did not answer (down, wrong URL, HTTP error, not JSON)."""


class RpcCallError(Exception):
    """The node answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(f"{message} (code {code}{', ' + json.dumps(data) if data is not None else ''})")
        self.code = code
        self.message = message
        self.data = data


def post(url: str, body: Any, timeout: float) -> Any:
    request = urllib.request.Request(url.rstrip("/") + "/", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RpcUnreachable(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RpcUnreachable(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _result(response: Any) -> Any:
    if not isinstance(response, dict):
        raise RpcUnreachable("response is not a JSON-RPC object")
    if "error" in response:
        error = response["error"] or {}
        return RpcCallError(error.get("code", 0), error.get("message", ""), error.get("data"))
    return response.get("result")


def call(url: str, method: str, *params: Any, timeout: float = 10.0) -> Any:
    result = _result(post(url, {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": list(params)},
                          timeout))
    if isinstance(result, RpcCallError):
        raise result
    return result


def batch(url: str, calls: list[tuple[str, list]], timeout: float = 30.0) -> list[Any]:
    if not calls:
        return []
    first = next(_ids)
    body = [{"jsonrpc": "2.0", "id": first + i, "method": m, "params": p} for i, (m, p) in enumerate(calls)]
    for _ in range(len(calls) - 1):
        next(_ids)
    responses = post(url, body, timeout)
    if not isinstance(responses, list):
        raise RpcUnreachable(f"batch answered with {_result(responses)!r}")
    by_id = {r.get("id"): r for r in responses if isinstance(r, dict)}
    return [_result(by_id.get(first + i, {"error": {"code": 0, "message": "no response"}}))
            for i in range(len(calls))]

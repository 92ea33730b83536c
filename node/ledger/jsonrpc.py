"""The project's one JSON-RPC 2.0 client over HTTP (ADR 0190): the node's, and the CLI's and tools'.

``ValidatorPool(urls)`` is the node's (aiohttp, never blocking the event loop), with failover: it
keeps the URL that answered last as the preferred one; a call that cannot reach it (connection
refused, timeout, HTTP error, a body that is not JSON-RPC) tries the next URLs in turn and raises
LedgerUnavailable only when none answered. An error *answer* is not retried elsewhere: it raises
RpcAnswerError (the validator understood and refused).

``call(url, method, *params)`` and ``batch(url, [(method, params), ...])`` are the blocking form
(stdlib urllib) for the CLI, devtools and tests: ``call`` returns the result or raises
RpcAnswerError or LedgerUnavailable (connection or HTTP failure, not JSON-RPC); ``batch`` sends one
batch and returns results or RpcAnswerError instances in request order. Both forms build requests
and read answers with the same two functions.
"""
from __future__ import annotations

import itertools
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import aiohttp

from .errors import LedgerUnavailable, RpcAnswerError

log = logging.getLogger(__name__)

_ids = itertools.count(1)


HEADERS = {"Content-Type": "application/json"}


def endpoint(url: str) -> str:
    return url.rstrip("/") + "/"


def request(method: str, params: list, request_id: int | None = None) -> dict[str, Any]:
    """One JSON-RPC 2.0 request object (a fresh id unless given)."""
    return {"jsonrpc": "2.0", "id": next(_ids) if request_id is None else request_id, "method": method,
            "params": params}


def result_of(answer: Any) -> Any:
    """The result of one answer object, or the RpcAnswerError it carries (returned, not raised);
    TypeError when ``answer`` is not a JSON-RPC object."""
    if not isinstance(answer, dict):
        raise TypeError("response is not a JSON-RPC object")
    if "error" in answer:
        error = answer["error"] if isinstance(answer["error"], dict) else {}
        return RpcAnswerError(error.get("code", 0), error.get("message", ""), error.get("data"))
    return answer.get("result")


def raise_error(result: Any) -> Any:
    if isinstance(result, RpcAnswerError):
        raise result
    return result


def check_http_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else ValueError."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return url


def ws_url(url: str) -> str:
    """The websocket endpoint (``/ws``) of a validator's JSON-RPC URL."""
    parts = urllib.parse.urlsplit(url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/ws", "", ""))


class ValidatorPool:
    """Validators' JSON-RPC URLs, tried in order starting from the last one that answered."""

    def __init__(self, urls: list[str], timeout: float = 10.0) -> None:
        self.urls = list(dict.fromkeys(urls))
        self.timeout = timeout
        self.preferred = 0
        self._session: aiohttp.ClientSession | None = None
        self._ws_session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return self.urls[self.preferred] if self.urls else ""

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    def ws_session(self) -> aiohttp.ClientSession:
        """For websockets: only connecting is bounded in time (a subscription lasts)."""
        if self._ws_session is None or self._ws_session.closed:
            self._ws_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout, connect=self.timeout))
        return self._ws_session

    def rotation(self) -> list[int]:
        """URL indexes in the order to try them: the preferred one first."""
        n = len(self.urls)
        return [(self.preferred + i) % n for i in range(n)]

    async def call(self, method: str, *params: Any) -> Any:
        if not self.urls:
            raise LedgerUnavailable(f"{method}: no validator JSON-RPC URL configured")
        errors = []
        for index in self.rotation():
            try:
                result = await self._post(self.urls[index], method, list(params))
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, TypeError) as exc:
                errors.append(f"{self.urls[index]}: {type(exc).__name__}: {exc}")
                continue
            if index != self.preferred:
                log.info("ledger reads fail over to %s", self.urls[index])
                self.preferred = index
            return result
        raise LedgerUnavailable(f"{method}: no validator answered ({'; '.join(errors)})")

    async def _post(self, url: str, method: str, params: list) -> Any:
        async with self.session().post(endpoint(url), data=json.dumps(request(method, params)),
                                       headers=HEADERS) as response:
            if response.status != 200:
                raise aiohttp.ClientResponseError(response.request_info, (), status=response.status,
                                                  message=response.reason or "")
            answer = json.loads(await response.read())
        return raise_error(result_of(answer))

    async def close(self) -> None:
        for session in (self._session, self._ws_session):
            if session is not None:
                await session.close()
        self._session = self._ws_session = None


# ---- the blocking form


def post(url: str, body: Any, timeout: float) -> Any:
    """POST ``body`` as JSON and return the decoded answer; LedgerUnavailable when that fails."""
    http_request = urllib.request.Request(endpoint(url), data=json.dumps(body).encode(), headers=HEADERS,
                                          method="POST")
    try:
        with urllib.request.urlopen(http_request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise LedgerUnavailable(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise LedgerUnavailable(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _result(answer: Any) -> Any:
    try:
        return result_of(answer)
    except TypeError as exc:
        raise LedgerUnavailable(str(exc)) from None


def call(url: str, method: str, *params: Any, timeout: float = 10.0) -> Any:
    return raise_error(_result(post(url, request(method, list(params)), timeout)))


def batch(url: str, calls: list[tuple[str, list]], timeout: float = 30.0) -> list[Any]:
    if not calls:
        return []
    ids = [next(_ids) for _ in calls]
    responses = post(url, [request(m, p, i) for i, (m, p) in zip(ids, calls)], timeout)
    if not isinstance(responses, list):
        raise LedgerUnavailable(f"batch answered with {_result(responses)!r}")
    by_id = {r.get("id"): r for r in responses if isinstance(r, dict)}
    return [_result(by_id.get(i, {"error": {"code": 0, "message": "no response"}})) for i in ids]

"""JSON-RPC calls to validators over HTTP (aiohttp, never blocking the event loop), with failover.

``ValidatorPool(urls)`` keeps the URL that answered last as the preferred one; a call that cannot
reach it (connection refused, timeout, HTTP error, a body that is not JSON-RPC) tries the next
URLs in turn and raises LedgerUnavailable only when none answered. An error *answer* is not
retried elsewhere: it raises RpcAnswerError (the validator understood and refused).
"""
from __future__ import annotations

import itertools
import json
import logging
import urllib.parse
from typing import Any

import aiohttp

from .errors import LedgerUnavailable, RpcAnswerError

log = logging.getLogger(__name__)

_ids = itertools.count(1)


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
        body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
        async with self.session().post(url.rstrip("/") + "/", data=json.dumps(body),
                                       headers={"Content-Type": "application/json"}) as response:
            if response.status != 200:
                raise aiohttp.ClientResponseError(response.request_info, (), status=response.status,
                                                  message=response.reason or "")
            answer = json.loads(await response.read())
        if not isinstance(answer, dict):
            raise TypeError("response is not a JSON-RPC object")
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {}
            raise RpcAnswerError(error.get("code", 0), error.get("message", ""), error.get("data"))
        return answer.get("result")

    async def close(self) -> None:
        for session in (self._session, self._ws_session):
            if session is not None:
                await session.close()
        self._session = self._ws_session = None

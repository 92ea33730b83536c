"""Sans-I/O JSON-RPC 2.0 dispatcher: request body bytes in, response bytes (or None) out.

Methods are ``dkb_*`` async callables; their parameters are bound from a positional array or a
named object by their signature and checked against their annotations (str, int, float, bool,
list, dict, X | None, list[str], Any), so a wrong or missing parameter gives -32602 before the
method runs. Batches run concurrently; notifications get no response; junk of any kind gives a
valid JSON-RPC error, never an exception, and internal failures never leak tracebacks.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import time
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any

from node.metrics import Registry
from node.rpc.errors import InternalError, InvalidParams, InvalidRequest, MethodNotFound, ParseError, RpcError

log = logging.getLogger(__name__)

METHOD_PREFIX = "dkb_"
RpcMethod = Callable[..., Awaitable[Any]]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def decode_json(body: bytes) -> Any:
    """Strict JSON decoding (UTF-8, no NaN/Infinity, no overflowing floats); raises ParseError."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ParseError(data=_short_reason(exc)) from None


def _short_reason(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nesting too deep"
    if isinstance(exc, UnicodeDecodeError):
        return "body is not UTF-8"
    return str(exc)[:200]


def encode_json(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def error_response(request_id: Any, error: RpcError) -> str:
    return encode_json({"jsonrpc": "2.0", "id": request_id, "error": error.to_json()})


class _Method:
    """A registered method with its signature and the annotations it is checked against."""

    def __init__(self, name: str, func: RpcMethod):
        self.name = name
        self.func = func
        self.signature = inspect.signature(func)
        try:
            self.hints = typing.get_type_hints(func)
        except Exception:  # annotations that cannot be resolved are simply not checked
            self.hints = {}

    def bind(self, params: list | dict | None) -> inspect.BoundArguments:
        try:
            if params is None:
                bound = self.signature.bind()
            elif isinstance(params, list):
                bound = self.signature.bind(*params)
            else:
                bound = self.signature.bind(**params)
        except TypeError as exc:
            raise InvalidParams(f"Invalid params: {exc}") from None
        for pname, value in bound.arguments.items():
            hint = self.hints.get(pname)
            kind = self.signature.parameters[pname].kind
            if hint is None or kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            if not _matches(value, hint):
                raise InvalidParams(f"Invalid params: {pname!r} must be {_describe(hint)}, got {_json_type(value)}")
        return bound


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint in (str, list, dict):
        return isinstance(value, hint)
    if origin is list:
        args = typing.get_args(hint)
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    if origin is dict:
        args = typing.get_args(hint)
        return isinstance(value, dict) and (not args or all(_matches(v, args[1]) for v in value.values()))
    return True  # an annotation we do not check; the method validates it itself


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
             dict: "an object", type(None): "null"}
    if hint in names:
        return names[hint]
    if origin is list:
        return "an array"
    if origin is dict:
        return "an object"
    return str(hint)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class Dispatcher:
    """Routes JSON-RPC 2.0 requests to registered ``dkb_*`` async methods.

    ``child()`` makes a dispatcher that adds its own methods (e.g. per-websocket
    ``dkb_subscribe``) and falls back to this one for the rest.
    """

    def __init__(self, *, max_body_bytes: int = 1 << 20, max_batch: int = 100, metrics: Registry | None = None,
                 parent: Dispatcher | None = None):
        self.max_body_bytes = max_body_bytes
        self.max_batch = max_batch
        self._parent = parent
        self._methods: dict[str, _Method] = {}
        registry = metrics or Registry()
        self._calls = registry.counter("dekube_rpc_requests_total", "JSON-RPC calls by method and outcome.",
                                       ["method", "outcome"])
        self._seconds = registry.histogram("dekube_rpc_request_duration_seconds", "JSON-RPC call latency.",
                                           ["method"])
        self._metrics = registry

    def child(self) -> Dispatcher:
        return Dispatcher(max_body_bytes=self.max_body_bytes, max_batch=self.max_batch, metrics=self._metrics,
                          parent=self)

    def register(self, name: str, func: RpcMethod, *, replace: bool = False) -> None:
        if not name.startswith(METHOD_PREFIX) or len(name) == len(METHOD_PREFIX):
            raise ValueError(f"RPC method name {name!r} must start with {METHOD_PREFIX!r}")
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"RPC method {name} must be an async function")
        if name in self._methods and not replace:
            raise ValueError(f"RPC method {name} is already registered")
        self._methods[name] = _Method(name, func)

    def method(self, name: str) -> Callable[[RpcMethod], RpcMethod]:
        """Decorator form of ``register``."""

        def decorate(func: RpcMethod) -> RpcMethod:
            self.register(name, func)
            return func

        return decorate

    def _lookup(self, name: str) -> _Method | None:
        found = self._methods.get(name)
        if found is None and self._parent is not None:
            return self._parent._lookup(name)
        return found

    async def handle(self, body: bytes) -> bytes | None:
        """Answer one HTTP/websocket body; None means no response (notifications only)."""
        if len(body) > self.max_body_bytes:
            return error_response(None, InvalidRequest(
                f"Invalid Request: body of {len(body)} bytes exceeds the limit of {self.max_body_bytes}")).encode()
        try:
            message = decode_json(body)
        except ParseError as exc:
            return error_response(None, exc).encode()
        if isinstance(message, list):
            if not message:
                return error_response(None, InvalidRequest("Invalid Request: empty batch")).encode()
            if len(message) > self.max_batch:
                return error_response(None, InvalidRequest(
                    f"Invalid Request: batch of {len(message)} exceeds the limit of {self.max_batch}")).encode()
            answers = await asyncio.gather(*(self._handle_one(item) for item in message))
            parts = [a for a in answers if a is not None]
            return ("[" + ",".join(parts) + "]").encode() if parts else None
        answer = await self._handle_one(message)
        return None if answer is None else answer.encode()

    async def _handle_one(self, request: Any) -> str | None:
        if not isinstance(request, dict):
            return error_response(None, InvalidRequest("Invalid Request: expected a JSON object"))
        request_id = request.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int, float, type(None))):
            return error_response(None, InvalidRequest("Invalid Request: id must be a string, number or null"))
        is_notification = "id" not in request
        if request.get("jsonrpc") != "2.0":
            return error_response(request_id, InvalidRequest('Invalid Request: "jsonrpc" must be "2.0"'))
        name = request.get("method")
        if not isinstance(name, str):
            return error_response(request_id, InvalidRequest('Invalid Request: "method" must be a string'))
        params = request.get("params")
        if "params" in request and not isinstance(params, (list, dict)):
            return error_response(request_id, InvalidRequest('Invalid Request: "params" must be an array or object'))
        method = self._lookup(name)
        if method is None:
            self._calls.inc(method="<unknown>", outcome="not_found")
            if is_notification:
                return None
            return error_response(request_id, MethodNotFound(f"Method not found: {name[:100]}"))
        started = time.perf_counter()
        outcome = "ok"
        try:
            bound = method.bind(params)
            result = await method.func(*bound.args, **bound.kwargs)
            body = None if is_notification else self._result_response(name, request_id, result)
        except RpcError as exc:
            body = None if is_notification else error_response(request_id, exc)
            outcome = f"error_{-exc.code}"
        except Exception:
            log.exception("RPC method %s failed", name)
            body = None if is_notification else error_response(request_id, InternalError())
            outcome = "internal_error"
        self._calls.inc(method=name, outcome=outcome)
        self._seconds.observe(time.perf_counter() - started, method=name)
        return body

    @staticmethod
    def _result_response(name: str, request_id: Any, result: Any) -> str:
        try:
            return encode_json({"jsonrpc": "2.0", "id": request_id, "result": result})
        except (TypeError, ValueError) as exc:
            log.error("RPC method %s returned a value that is not JSON: %s", name, exc)
            raise InternalError() from None

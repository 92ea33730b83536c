"""JSON-RPC 2.0 error codes and the exceptions methods raise to return them.

Standard codes come from the JSON-RPC 2.0 spec; the server range -32000..-32005 follows the
names wallets know from EIP-1474. A method raises e.g. ``InvalidParams("address: bad peer ID")``
or ``TransactionRejected("nonce too low", data={"expected": 7})``; any other exception becomes
-32603 Internal error with no details leaked to the client.
"""
from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
INVALID_INPUT = -32000
RESOURCE_NOT_FOUND = -32001
RESOURCE_UNAVAILABLE = -32002
TRANSACTION_REJECTED = -32003
METHOD_NOT_SUPPORTED = -32004
LIMIT_EXCEEDED = -32005


class RpcError(Exception):
    """An error returned to the client as ``{"code", "message", "data"?}``."""

    code = INTERNAL_ERROR
    default_message = "Internal error"

    def __init__(self, message: str | None = None, data: Any = None, *, code: int | None = None):
        self.message = message or self.default_message
        self.data = data
        if code is not None:
            self.code = code
        super().__init__(self.message)

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ParseError(RpcError):
    code, default_message = PARSE_ERROR, "Parse error"


class InvalidRequest(RpcError):
    code, default_message = INVALID_REQUEST, "Invalid Request"


class MethodNotFound(RpcError):
    code, default_message = METHOD_NOT_FOUND, "Method not found"


class InvalidParams(RpcError):
    code, default_message = INVALID_PARAMS, "Invalid params"


class InternalError(RpcError):
    code, default_message = INTERNAL_ERROR, "Internal error"


class InvalidInput(RpcError):
    code, default_message = INVALID_INPUT, "Invalid input"


class ResourceNotFound(RpcError):
    code, default_message = RESOURCE_NOT_FOUND, "Resource not found"


class ResourceUnavailable(RpcError):
    code, default_message = RESOURCE_UNAVAILABLE, "Resource unavailable"


class TransactionRejected(RpcError):
    code, default_message = TRANSACTION_REJECTED, "Transaction rejected"


class MethodNotSupported(RpcError):
    code, default_message = METHOD_NOT_SUPPORTED, "Method not supported"


class LimitExceeded(RpcError):
    code, default_message = LIMIT_EXCEEDED, "Limit exceeded"

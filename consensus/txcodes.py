"""Result codes for transaction checks and execution, and the error that carries them.

Codes are stable integers (they are stored in receipts). ``TxCode.rpc_code`` maps each to
the JSON-RPC server-error range the RPC layer reports (-32000..-32005).
"""
from __future__ import annotations

import enum


class TxCode(enum.IntEnum):
    OK = 0
    BAD_ENCODING = 1
    OVERSIZED = 2
    WRONG_CHAIN = 3
    UNKNOWN_TYPE = 4
    BAD_PAYLOAD = 5
    BAD_SIGNATURE = 6
    NONCE_TOO_LOW = 7
    NONCE_TOO_HIGH = 8
    INSUFFICIENT_FUNDS = 9
    ALREADY_KNOWN = 10
    FEE_TOO_LOW = 11
    MEMPOOL_FULL = 12
    UNAUTHORIZED = 13
    NOT_FOUND = 14
    BAD_STATE = 15
    REPLAYED = 16
    INVALID_EVIDENCE = 17
    REPLACEMENT_UNDERPRICED = 18

    @property
    def rpc_code(self) -> int:
        """JSON-RPC error code: specific ones for the common wallet errors, -32000 otherwise."""
        return _RPC_CODES.get(self, -32000)


_RPC_CODES = {
    TxCode.NONCE_TOO_LOW: -32001,
    TxCode.NONCE_TOO_HIGH: -32002,
    TxCode.INSUFFICIENT_FUNDS: -32003,
    TxCode.BAD_SIGNATURE: -32004,
    TxCode.ALREADY_KNOWN: -32005,
}


class TxError(Exception):
    """A transaction was rejected; ``code`` says why, ``message`` gives details."""

    def __init__(self, code: TxCode, message: str = ""):
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message or code.name.lower().replace("_", " ")

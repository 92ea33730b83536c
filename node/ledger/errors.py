"""The errors the ledger gateway raises: the ledger cannot be reached, or a transaction failed."""
from __future__ import annotations

import json


class LedgerUnavailable(ConnectionError):
    """No validator answered (or one answered a read with an error), or the node has no ledger."""


class TxFailed(RuntimeError):
    """A transaction was rejected on submission, executed with a non-zero code, or got no receipt.

    ``code``: the ledger's code name (``"nonce_too_low"``, ``"insufficient_funds"``...) when known;
    ``receipt``: the receipt of a transaction that executed with an error (its block's height)."""

    def __init__(self, tx_type: str, detail: str, code: str | int | None = None, receipt: dict | None = None):
        super().__init__(f"{tx_type}: {detail}")
        self.tx_type = tx_type
        self.detail = detail
        self.code = code
        self.receipt = receipt


class RpcAnswerError(Exception):
    """A validator answered a JSON-RPC call with an error object (``code``, ``message``, ``data``)."""

    def __init__(self, code: int, message: str, data=None):
        super().__init__(f"{message} (code {code}{', ' + json.dumps(data, default=str) if data is not None else ''})")
        self.code = code
        self.message = message
        self.data = data

    @property
    def tx_code(self) -> str | None:
        """The transaction code name of a rejected submission (e.g. ``NONCE_TOO_LOW``), else None."""
        return self.data.get("code") if isinstance(self.data, dict) else None

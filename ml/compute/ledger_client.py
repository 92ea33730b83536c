"""Async access to the ledger over a validator's JSON-RPC: reads, and signed transactions in nonce order.

The blocking stdlib client (`consensus.rpcclient`) runs in a thread so the event loop never waits
on HTTP. `send` signs with the node's key, takes the next nonce from the `pending` count, submits
and waits for the receipt; one send at a time per client, so this node's nonces never race.
"""
from __future__ import annotations

import asyncio
import time

from consensus import rpcclient
from consensus.tx import DEFAULT_FEE, build_tx
from node.identity import Identity

RECEIPT_POLL_S = 0.2


class LedgerUnavailable(ConnectionError):
    """The validator RPC did not answer, or answered with an error."""


class TxFailed(RuntimeError):
    """A transaction was rejected on submission or executed with a non-zero code."""

    def __init__(self, tx_type: str, detail: str, code: str | int | None = None):
        super().__init__(f"{tx_type}: {detail}")
        self.code = code


class LedgerClient:
    def __init__(self, url: str, identity: Identity, fee: int = DEFAULT_FEE, timeout: float = 10.0):
        self.url = url
        self.identity = identity
        self.fee = fee
        self.timeout = timeout
        self._send_lock = asyncio.Lock()
        self._chain_id: str | None = None

    async def call(self, method: str, *params):
        try:
            return await asyncio.to_thread(rpcclient.call, self.url, method, *params, timeout=self.timeout)
        except (rpcclient.RpcUnreachable, rpcclient.RpcCallError) as exc:
            raise LedgerUnavailable(f"{method}: {exc}") from None

    async def chain_id(self) -> str:
        if self._chain_id is None:
            self._chain_id = await self.call("dkb_chainId")
        return self._chain_id

    async def send(self, tx_type: str, payload: dict, wait_s: float = 30.0) -> dict:
        """Sign, submit and wait for the receipt; returns it, raises TxFailed unless it succeeded."""
        async with self._send_lock:
            chain_id = await self.chain_id()
            nonce = await self.call("dkb_getTransactionCount", self.identity.peer_id, "pending")
            tx = build_tx(self.identity, chain_id, nonce, tx_type, payload, self.fee)
            try:
                tx_hash = await asyncio.to_thread(rpcclient.call, self.url, "dkb_sendRawTransaction",
                                                  tx.raw.hex(), timeout=self.timeout)
            except rpcclient.RpcCallError as exc:
                raise TxFailed(tx_type, str(exc), (exc.data or {}).get("code")) from None
            except rpcclient.RpcUnreachable as exc:
                raise LedgerUnavailable(f"dkb_sendRawTransaction: {exc}") from None
            receipt = await self._wait_receipt(tx_hash, wait_s)
        if receipt["code"] != 0:
            raise TxFailed(tx_type, f"{receipt['status']} {receipt['log']}".strip(), receipt["status"])
        return receipt

    async def _wait_receipt(self, tx_hash: str, wait_s: float) -> dict:
        deadline = time.monotonic() + wait_s
        while True:
            receipt = await self.call("dkb_getTransactionReceipt", tx_hash)
            if receipt is not None:
                return receipt
            if time.monotonic() > deadline:
                raise TxFailed("receipt", f"no receipt for {tx_hash} after {wait_s:g} s")
            await asyncio.sleep(RECEIPT_POLL_S)

"""Submitting co-signed relay receipts to the ledger over a node's JSON-RPC.

``rpc_receipt_submitter(url, identity, chain_id)`` returns the async ``submit`` callable the relay
service takes: it signs a ``relay_receipt`` transaction with the relay's identity (nonce from
``dkb_getTransactionCount(..., "pending")``) and sends it with ``dkb_sendRawTransaction``, without
waiting for the block (receipts of many circuits must not queue behind one another's inclusion).
``url`` may be a callable, read at each submission (a node's own RPC URL is known only once it
serves). The blocking HTTP calls run in a worker thread, off the event loop; calls are serialised
so nonces never collide.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from consensus import rpcclient
from consensus.tx import DEFAULT_FEE, build_tx
from node.identity import Identity

from .service import Submit


def rpc_receipt_submitter(url: str | Callable[[], str], identity: Identity, chain_id: str, fee: int = DEFAULT_FEE,
                          timeout: float = 10.0, lock: asyncio.Lock | None = None) -> Submit:
    """``lock``: shared with this identity's other senders, so their nonces never collide either."""
    lock = lock or asyncio.Lock()

    def send(target: str, payload: dict) -> str:
        nonce = rpcclient.call(target, "dkb_getTransactionCount", identity.peer_id, "pending", timeout=timeout)
        tx = build_tx(identity, chain_id, nonce, "relay_receipt", payload, fee)
        return rpcclient.call(target, "dkb_sendRawTransaction", tx.raw.hex(), timeout=timeout)

    async def submit(payload: dict) -> None:
        target = url() if callable(url) else url
        async with lock:
            await asyncio.to_thread(send, target, payload)

    return submit

"""The node's one ledger gateway (``node.ledger``): reads, transactions, record, event streams.

Reads go to the node's own validator when it runs one (``attach_local``, handed in by the
validator role at setup), else to the configured validators' JSON-RPC with failover
(``ValidatorPool``). Transactions are signed by the node's key with the ``TxEncoding`` handed in
(default: the installed ``node.plugins``' one, the ledger's encoder and ``DEFAULT_FEE``; node/
names no consensus code, ADR 0201) and sent by this one sender: nonces come from a local
``NonceBook`` synced once from the ``pending`` count; up to ``max_in_flight`` transactions are
pipelined (the mempool's nonce window), no lock is held across a receipt wait; a nonce error
resyncs the book and resubmits (at most ``NONCE_RETRIES`` times). ``send`` returns the receipt or
raises TxFailed / LedgerUnavailable; ``send_tx`` returns a ``SentTx`` (hash, nonce, receipt) and can
skip the wait. The CLI sends its users' transactions through a gateway too (cli/tx_sender.py).
Receipts arrive on the ``txs`` topic (this node's own transactions, subscribed from the first send
on, in ``run``), with a read as the fallback (every 0.25 s while no subscription is live).
``subscribe(topic)`` streams ledger events (``tasks``, ``newHeads``) with RESYNC marks.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from node.identity import Identity
from node.plugins import TxEncoding, installed
from node.rpc.errors import RpcError
from node.rpc.pubsub import Hub

from .errors import LedgerUnavailable, RpcAnswerError, TxFailed
from .events import RESYNC, local_stream, websocket_stream
from .jsonrpc import ValidatorPool
from .nonces import NonceBook
from .record import RecordPublisher

log = logging.getLogger(__name__)

TXS_TOPIC = "txs"
MAX_IN_FLIGHT = 16         # the mempool's default nonce window (max_nonce_ahead)
NONCE_RETRIES = 2
NONCE_ERRORS = frozenset({"NONCE_TOO_LOW", "NONCE_TOO_HIGH", "REPLACEMENT_UNDERPRICED"})
RECEIPT_WAIT_S = 30.0
RECEIPT_POLL_S = 0.25      # reading receipts while no txs subscription is live
RECEIPT_POLL_LIVE_S = 3.0  # ... and while one is (a safety net for a missed notification)
LOCAL_WAIT_S = 60.0


class LocalLedger(Protocol):
    """A validator in this process, as the gateway reads it (handed in by the validator role)."""

    ready: asyncio.Event

    async def call(self, method: str, *params: Any) -> Any:
        """Answer a ``dkb_*`` JSON-RPC method in-process; raises ``node.rpc.errors.RpcError``."""

METHOD_NOT_FOUND = -32601  # JSON-RPC 2.0


@dataclass(frozen=True)
class SentTx:
    """A transaction the gateway signed and the ledger accepted: its hash, its nonce and its receipt
    (None when it was sent without waiting)."""

    tx_hash: str
    nonce: int
    receipt: dict | None = None


class LedgerGateway:
    def __init__(self, identity: Identity, urls: list[str], *, hub: Hub | None = None,
                 tx: TxEncoding | None = None, timeout: float = 10.0,
                 max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.identity = identity
        self.peer_id = identity.peer_id
        self.pool = ValidatorPool(urls, timeout)
        self.hub = hub
        self.tx = tx
        self.local: LocalLedger | None = None
        self._chain_id: str | None = None
        self._nonces = NonceBook()
        self._nonce_sync = asyncio.Lock()
        self._window = asyncio.Semaphore(max_in_flight)
        self._receipts: dict[str, asyncio.Future] = {}
        self._receipt_feed_live = False
        self._first_send = asyncio.Event()   # the receipt feed opens once this node sends
        self.counters = {"sent": 0, "failed": 0, "nonce_resyncs": 0}
        self.record = RecordPublisher(self.peer_id, self.node_info, self.send)

    # ---- wiring
    def attach_local(self, local: LocalLedger) -> None:
        """Read from and submit to ``local`` (this node's validator) instead of JSON-RPC."""
        self.local = local

    @property
    def available(self) -> bool:
        """A ledger is configured: a local validator or at least one JSON-RPC URL."""
        return self.local is not None or bool(self.pool.urls)

    @property
    def is_local(self) -> bool:
        return self.local is not None

    @property
    def url(self) -> str:
        """Where reads go: "local" or the preferred validator URL ("" without a ledger)."""
        return "local" if self.local is not None else self.pool.url

    def describe(self) -> str | None:
        return self.url if self.available else None

    def status(self) -> dict:
        """The ``ledger`` section of ``/status``."""
        return {"ledger": self.describe(), "urls": self.pool.urls, "in_flight": len(self._receipts),
                "next_nonce": self._nonces.next, "receipt_feed_live": self._receipt_feed_live,
                "txs_sent": self.counters["sent"], "txs_failed": self.counters["failed"],
                "nonce_resyncs": self.counters["nonce_resyncs"],
                "record": self.record.published, "record_error": self.record.last_error}

    # ---- reads
    async def call(self, method: str, *params: Any) -> Any:
        """A ``dkb_*`` read; raises LedgerUnavailable when no validator answers it."""
        try:
            return await self._raw_call(method, *params)
        except RpcAnswerError as exc:
            if exc.code == METHOD_NOT_FOUND and method.startswith("dkb_"):
                raise LedgerUnavailable(f"{method}: {self.url or 'the ledger'} is not a validator's JSON-RPC "
                                        "(no dkb_* methods); set [ledger] rpc_urls to a validator's URL") from None
            raise LedgerUnavailable(f"{method}: {exc}") from None

    async def _raw_call(self, method: str, *params: Any) -> Any:
        if self.local is not None:
            if not self.local.ready.is_set():
                try:
                    await asyncio.wait_for(self.local.ready.wait(), LOCAL_WAIT_S)
                except TimeoutError:
                    raise LedgerUnavailable(f"{method}: the local chain is still loading") from None
            try:
                return await self.local.call(method, *params)
            except RpcError as exc:
                raise RpcAnswerError(exc.code, exc.message, exc.data) from None
        if not self.pool.urls:
            raise LedgerUnavailable(f"{method}: this node has no ledger (set [ledger] rpc_urls)")
        return await self.pool.call(method, *params)

    @property
    def fee(self) -> int:
        """What each transaction pays (the encoding's fee); LedgerUnavailable without an encoding."""
        tx = self.tx or installed().tx
        if tx is None:
            raise LedgerUnavailable("no transaction encoding installed (node.plugins)")
        return tx.fee

    async def chain_id(self) -> str:
        if self._chain_id is None:
            self._chain_id = await self.call("dkb_chainId")
        return self._chain_id

    async def node_info(self, peer_id: str) -> dict | None:
        return await self.call("dkb_getNode", peer_id)

    async def bonded(self, peer_id: str) -> int:
        return (await self.call("dkb_getStake", peer_id))["bonded"]

    async def balance(self, peer_id: str) -> int:
        return int(await self.call("dkb_getBalance", peer_id))

    # ---- transactions
    async def send(self, tx_type: str, payload: dict, wait_s: float = RECEIPT_WAIT_S) -> dict:
        """Sign with the node's key, submit, wait for the receipt; returns it.
        Raises TxFailed (refused, failed in its block, or no receipt in ``wait_s``) or LedgerUnavailable."""
        receipt = (await self.send_tx(tx_type, payload, wait_s)).receipt
        assert receipt is not None
        return receipt

    async def send_tx(self, tx_type: str, payload: dict, wait_s: float = RECEIPT_WAIT_S, *,
                      wait: bool = True) -> SentTx:
        """``send``, returning the hash and nonce as well; ``wait=False`` returns once the ledger
        accepted the transaction into its mempool (no receipt)."""
        self._first_send.set()
        try:
            async with self._window:
                tx_hash, nonce, waiter = await self._submit(tx_type, payload)
                try:
                    receipt = await self._wait_receipt(tx_hash, waiter, wait_s) if wait else None
                finally:
                    self._receipts.pop(tx_hash, None)
        except (TxFailed, LedgerUnavailable):
            self.counters["failed"] += 1
            raise
        if receipt is not None and receipt["code"] != 0:
            self.counters["failed"] += 1
            raise TxFailed(tx_type, f"{receipt['status']} {receipt['log']}".strip(), receipt["status"], receipt)
        self.counters["sent"] += 1
        return SentTx(tx_hash, nonce, receipt)

    async def _submit(self, tx_type: str, payload: dict) -> tuple[str, int, asyncio.Future]:
        chain_id = await self.chain_id()
        tx = self.tx = self.tx or installed().tx
        if tx is None:
            raise TxFailed(tx_type, "no transaction encoding installed (node.plugins)", "no_encoding")
        for attempt in range(NONCE_RETRIES + 1):
            nonce = await self._take_nonce()
            try:
                raw = tx.encode(self.identity, chain_id, nonce, tx_type, payload, tx.fee)
            except ValueError as exc:
                self._nonces.give_back(nonce)
                raise TxFailed(tx_type, str(exc), "bad_payload") from None
            tx_hash = hashlib.sha256(raw).hexdigest()
            waiter = self._receipts[tx_hash] = asyncio.get_running_loop().create_future()
            try:
                await self._raw_call("dkb_sendRawTransaction", raw.hex())
            except RpcAnswerError as exc:
                self._receipts.pop(tx_hash, None)
                if exc.tx_code in NONCE_ERRORS and attempt < NONCE_RETRIES:
                    log.info("nonce %d refused (%s): resyncing from the ledger", nonce, exc.tx_code)
                    self.counters["nonce_resyncs"] += 1
                    self._nonces.invalidate(nonce)
                    continue
                if exc.tx_code == "ALREADY_KNOWN":
                    self._nonces.accepted(nonce)
                    return tx_hash, nonce, self._receipts.setdefault(tx_hash, waiter)
                self._nonces.give_back(nonce)
                raise TxFailed(tx_type, exc.message, (exc.tx_code or "").lower() or exc.code) from None
            except BaseException:
                self._receipts.pop(tx_hash, None)
                self._nonces.invalidate(nonce)   # it may or may not have arrived: ask the ledger next time
                raise
            self._nonces.accepted(nonce)
            return tx_hash, nonce, waiter
        raise AssertionError("unreachable")

    async def _take_nonce(self) -> int:
        while self._nonces.needs_sync:
            async with self._nonce_sync:
                if self._nonces.needs_sync:
                    self._nonces.sync(await self.call("dkb_getTransactionCount", self.peer_id, "pending"))
        return self._nonces.take()

    async def _wait_receipt(self, tx_hash: str, waiter: asyncio.Future, wait_s: float) -> dict:
        deadline = time.monotonic() + wait_s
        while True:
            poll = RECEIPT_POLL_LIVE_S if self._receipt_feed_live else RECEIPT_POLL_S
            left = deadline - time.monotonic()
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), max(0.0, min(poll, left)))
            except TimeoutError:
                pass
            try:
                receipt = await self.call("dkb_getTransactionReceipt", tx_hash)
            except LedgerUnavailable:
                receipt = None
            if receipt is not None:
                return receipt
            if time.monotonic() >= deadline:
                self._nonces.invalidate()  # it may never be included: let the ledger say where we are
                raise TxFailed("receipt", f"no receipt for {tx_hash} after {wait_s:g} s")

    def _on_own_tx(self, receipt: Any) -> None:
        if isinstance(receipt, dict) and isinstance(receipt.get("tx_hash"), str):
            waiter = self._receipts.get(receipt["tx_hash"])
            if waiter is not None and not waiter.done():
                waiter.set_result(receipt)

    # ---- events
    def subscribe(self, topic: str, *params: Any) -> AsyncIterator[Any]:
        """Events of ``topic`` (``tasks``, ``newHeads``, ``txs`` + peer ID), with RESYNC after
        every (re)connect; iterate it in a task and cancel that task to stop."""
        if self.local is not None and self.hub is not None:
            return local_stream(self.hub, topic, params[0] if params else None)
        if not self.pool.urls:
            raise LedgerUnavailable(f"{topic}: this node has no ledger to subscribe to")
        return websocket_stream(self.pool, topic, list(params))

    async def _feed_receipts(self) -> None:
        """Resolve receipt waits from this node's ``txs`` topic."""
        try:
            async for event in self.subscribe(TXS_TOPIC, self.peer_id):
                if event is RESYNC:
                    self._receipt_feed_live = True
                else:
                    self._on_own_tx(event)
        finally:
            self._receipt_feed_live = False

    async def close(self) -> None:
        """Close the HTTP session (a gateway used without ``run``, e.g. by a tool or a test)."""
        await self.pool.close()

    # ---- service
    async def run(self) -> None:
        """The gateway's background work until cancelled: the receipt feed and the node record."""
        if not self.available:
            await asyncio.Event().wait()
        if self.local is not None:
            await self.local.ready.wait()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._keep_feeding_receipts())
                tasks.create_task(self.record.run())
        finally:
            await self.pool.close()

    async def _keep_feeding_receipts(self) -> None:
        await self._first_send.wait()
        while True:
            try:
                await self._feed_receipts()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. a validator without the txs topic: receipts are polled
                log.warning("no txs subscription (%s): receipts are read instead", exc)
                await asyncio.sleep(RECHECK_FEED_S)


RECHECK_FEED_S = 30.0

"""A closed-loop transaction load for tests and the soak: wallets that survive node failures.

Each account has at most one transaction in flight (like a wallet waiting for its receipt): it is
signed with the account's next nonce, sent to a random node, re-sent (same bytes, so it is
idempotent) to another node when no receipt arrived within ``resubmit_after`` seconds, and the
nonce advances only once a receipt is seen. So a node killed with transactions in its mempool
never leaves a nonce gap. ``confirmed`` holds the hashes a client got a successful receipt for,
``failed`` any receipt that was not OK (both feed ``chaincheck.check_chain``).
"""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

from consensus.tx import build_tx
from node.identity import Identity
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError


@dataclass
class _InFlight:
    hash: str
    raw_hex: str
    sent_at: float


class WalletLoad:
    def __init__(self, urls: list[str], chain_id: str, accounts: list[Identity], recipients: list[str],
                 rate: float = 20.0, resubmit_after: float = 3.0, seed: int = 1):
        self.urls = list(urls)
        self.chain_id = chain_id
        self.accounts = accounts
        self.recipients = recipients
        self.rate = rate
        self.resubmit_after = resubmit_after
        self.random = random.Random(seed)
        self.nonces = [0] * len(accounts)
        self.in_flight: dict[int, _InFlight] = {}
        self.confirmed: set[str] = set()
        self.failed: dict[str, str] = {}
        self.latencies: list[float] = []
        self.errors: Counter = Counter()
        self.submitted = 0
        self._first_sent: dict[str, float] = {}

    def run(self, stop: threading.Event, tick: float = 0.1) -> None:
        """Generate load until ``stop`` is set (call in a thread)."""
        budget = 0.0
        last = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            budget = min(budget + (now - last) * self.rate, self.rate)
            last = now
            self._poll_receipts()
            self._resubmit_stale(now)
            idle = [i for i in range(len(self.accounts)) if i not in self.in_flight]
            self.random.shuffle(idle)
            fresh = idle[:int(budget)]
            budget -= len(fresh)
            if fresh:
                self._send_new(fresh)
            stop.wait(tick)

    def drain(self, timeout: float) -> bool:
        """After the load stopped: wait (re-sending) until nothing is in flight; True if drained."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            self._poll_receipts()
            self._resubmit_stale(time.monotonic())
            time.sleep(0.2)
        return not self.in_flight

    # ---- internals
    def _url(self) -> str:
        return self.random.choice(self.urls)

    def _batch(self, calls: list) -> list | None:
        for _ in range(3):
            try:
                return jsonrpc.batch(self._url(), calls, timeout=10)
            except LedgerUnavailable:
                self.errors["unreachable"] += 1
        return None

    def _send_new(self, indexes: list[int]) -> None:
        now = time.monotonic()
        for i in indexes:
            to = self.recipients[self.random.randrange(len(self.recipients))]
            tx = build_tx(self.accounts[i], self.chain_id, self.nonces[i], "transfer", {"to": to, "amount": 1}, 1)
            self.in_flight[i] = _InFlight(tx.hash.hex(), tx.raw.hex(), now)
            self._first_sent[tx.hash.hex()] = now
        self._submit([self.in_flight[i] for i in indexes])
        self.submitted += len(indexes)

    def _submit(self, items: list[_InFlight]) -> None:
        results = self._batch([("dkb_sendRawTransaction", [item.raw_hex]) for item in items])
        for result in results or []:
            if isinstance(result, RpcAnswerError):
                self.errors[(result.data or {}).get("code", result.code)] += 1

    def _resubmit_stale(self, now: float) -> None:
        stale = [item for item in self.in_flight.values() if now - item.sent_at > self.resubmit_after]
        for item in stale:
            item.sent_at = now
        if stale:
            self.errors["resubmitted"] += len(stale)
            self._submit(stale)

    def _poll_receipts(self) -> None:
        pending = list(self.in_flight.items())
        for start in range(0, len(pending), 100):
            chunk = pending[start:start + 100]
            results = self._batch([("dkb_getTransactionReceipt", [item.hash]) for _, item in chunk])
            if results is None:
                return
            now = time.monotonic()
            for (i, item), receipt in zip(chunk, results):
                if receipt is None or isinstance(receipt, Exception):
                    continue
                del self.in_flight[i]
                self.nonces[i] += 1
                self.latencies.append(now - self._first_sent.pop(item.hash, now))
                if receipt["code"] == 0:
                    self.confirmed.add(item.hash)
                else:
                    self.failed[item.hash] = receipt["status"]

"""Nonce bookkeeping for one sender account (sans-I/O).

The book is synced once from the ledger's ``pending`` count, then hands out consecutive nonces
locally. A nonce whose transaction was refused (so never entered a mempool) is given back and
handed out again first, so no gap holds later transactions back. ``invalidate`` forgets the local
view (a nonce error, or a submission whose fate is unknown): the next ``take`` needs a fresh
``sync``, which never goes below a nonce still being submitted.
"""
from __future__ import annotations

import heapq


class NonceBook:
    def __init__(self) -> None:
        self.next: int | None = None
        self._free: list[int] = []
        self._submitting: set[int] = set()

    @property
    def needs_sync(self) -> bool:
        return self.next is None

    def sync(self, pending: int) -> None:
        """Adopt the ledger's pending count (ignored while the book is still valid)."""
        if self.next is not None:
            return
        self.next = max([pending, *(n + 1 for n in self._submitting)])
        self._free.clear()

    def take(self) -> int:
        """The nonce for the next transaction (marked as being submitted)."""
        if self.next is None:
            raise RuntimeError("nonce book needs a sync first")
        if self._free:
            nonce = heapq.heappop(self._free)
        else:
            nonce, self.next = self.next, self.next + 1
        self._submitting.add(nonce)
        return nonce

    def accepted(self, nonce: int) -> None:
        """The transaction with ``nonce`` is in a validator's mempool."""
        self._submitting.discard(nonce)

    def give_back(self, nonce: int) -> None:
        """The transaction with ``nonce`` was refused before entering a mempool: reuse the nonce."""
        self._submitting.discard(nonce)
        if self.next is not None and nonce < self.next and nonce not in self._free:
            heapq.heappush(self._free, nonce)

    def invalidate(self, nonce: int | None = None) -> None:
        """Forget the local view (after a nonce error on ``nonce`` or an unknown outcome)."""
        if nonce is not None:
            self._submitting.discard(nonce)
        self.next = None
        self._free.clear()

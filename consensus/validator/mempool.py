"""Mempool: pending transactions checked on entry, bounded, fairly evicted, reaped by fee.

Entry checks (cheapest first): size and shape, already known, nonce window (from the
account nonce up to ``max_nonce_ahead`` beyond it), fee, signature, and that the sender's
balance covers the fees and amounts of all its queued transactions. A transaction with a
nonce already queued replaces it only with a strictly higher fee.

Transactions wait per account by nonce; only the run of consecutive nonces starting at
the account nonce is ready (a gap holds the later ones back until it fills). ``reap``
takes ready transactions, highest fee first across accounts (then oldest), keeping each
account's nonces in order. When full (``max_txs``/``max_bytes``), the pool drops the
cheapest tail transaction (lowest fee, then from the account with most queued, then the
oldest) if the newcomer pays more; ``max_per_account`` caps any one sender. After a block
commits, ``update`` removes included transactions and re-checks every queued one, and drops
transactions that waited behind a nonce gap for more than ``gap_ttl_blocks`` blocks (a gap
nobody fills must not hold pool space, or a proposer's attention, forever). ``has_ready``
says whether anything could go in the next block: proposers pace empty blocks on it, never on
``len`` (a pool holding only gapped transactions is idle).
Not thread-safe: one thread (or a lock) at a time; it reads the ledger it was given.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from consensus.state.accounts import check_can_pay
from consensus.state.ledger import Ledger
from consensus.tx import Tx
from consensus.txcodes import TxCode, TxError


@dataclass(slots=True)
class _Entry:
    tx: Tx
    seq: int          # arrival order
    height: int       # ledger height when it arrived (for the gap TTL)


def spend_of(tx: Tx) -> int:
    """What executing ``tx`` takes from the sender's balance at most (fee + amount moved)."""
    payload = tx.payload
    if tx.type in ("transfer", "bond"):
        amount: int = payload["amount"]
        return tx.fee + amount
    if tx.type == "submit_task":
        price: int = payload["price"]
        return tx.fee + price
    return tx.fee


class Mempool:
    def __init__(self, ledger: Ledger, max_txs: int = 50_000, max_bytes: int = 64 * 1024 * 1024,
                 max_per_account: int = 64, max_nonce_ahead: int = 16, gap_ttl_blocks: int = 20):
        self.ledger = ledger
        self.max_txs = max_txs
        self.max_bytes = max_bytes
        self.max_per_account = max_per_account
        self.max_nonce_ahead = max_nonce_ahead
        self.gap_ttl_blocks = gap_ttl_blocks
        self._ready: set[str] = set()   # senders whose account-nonce transaction is queued
        self._by_sender: dict[str, dict[int, _Entry]] = {}
        self._by_hash: dict[bytes, Tx] = {}
        self._bytes = 0
        self._arrivals = itertools.count()

    # ---- inspection ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_hash)

    def __contains__(self, tx_hash: bytes) -> bool:
        return tx_hash in self._by_hash

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def has_ready(self) -> bool:
        """Whether some queued transaction could go in the next block (one set's truthiness: safe to
        read from another thread while the pool's owner mutates it)."""
        return bool(self._ready)

    def get(self, tx_hash: bytes) -> Tx | None:
        return self._by_hash.get(tx_hash)

    @property
    def known_txs(self) -> dict[bytes, Tx]:
        """A snapshot of hash -> decoded, signature-checked Tx (``Ledger.apply_block(known_txs=...)``)."""
        return dict(self._by_hash)

    def pending_nonce(self, peer_id: str) -> int:
        """The next nonce for ``peer_id`` counting its ready queued transactions ("pending")."""
        nonce = self.ledger.nonce(peer_id)
        queue = self._by_sender.get(peer_id, {})
        while nonce in queue:
            nonce += 1
        return nonce

    # ---- entry ------------------------------------------------------------------------------------

    def add(self, raw: bytes) -> Tx:
        """Check and queue wire bytes; returns the Tx or raises TxError with the reason."""
        return self.add_tx(self.ledger.decode_tx(raw))

    def add_tx(self, tx: Tx) -> Tx:
        if tx.hash in self._by_hash:
            raise TxError(TxCode.ALREADY_KNOWN, "transaction already in the mempool")
        if tx.size > self.ledger.params.max_tx_bytes:
            raise TxError(TxCode.OVERSIZED, f"{tx.size} bytes exceeds max_tx_bytes")
        account_nonce = self.ledger.nonce(tx.sender)
        if tx.nonce < account_nonce:
            raise TxError(TxCode.NONCE_TOO_LOW, f"nonce {tx.nonce} < account nonce {account_nonce}")
        if tx.nonce > account_nonce + self.max_nonce_ahead:
            raise TxError(TxCode.NONCE_TOO_HIGH,
                          f"nonce {tx.nonce} more than {self.max_nonce_ahead} ahead of {account_nonce}")
        if tx.fee < self.ledger.params.min_fee:
            raise TxError(TxCode.FEE_TOO_LOW, f"fee {tx.fee} < min_fee {self.ledger.params.min_fee}")
        queue = self._by_sender.get(tx.sender, {})
        replaced = queue.get(tx.nonce)
        if replaced is not None and tx.fee <= replaced.tx.fee:
            raise TxError(TxCode.REPLACEMENT_UNDERPRICED,
                          f"nonce {tx.nonce} already queued with fee {replaced.tx.fee}; pay more to replace it")
        if replaced is None and len(queue) >= self.max_per_account:
            raise TxError(TxCode.MEMPOOL_FULL, f"sender already has {len(queue)} queued transactions")
        if not tx.verify_signature():
            raise TxError(TxCode.BAD_SIGNATURE, "signature does not verify for the sender")
        queued_spend = sum(spend_of(e.tx) for n, e in queue.items() if n != tx.nonce)
        balance = self.ledger.balance(tx.sender)
        check_can_pay(balance, tx.fee)
        if queued_spend + spend_of(tx) > balance:
            raise TxError(TxCode.INSUFFICIENT_FUNDS,
                          f"balance {balance} < {spend_of(tx)} needed (+{queued_spend} already queued)")
        if replaced is not None:
            self._remove(replaced.tx)
        else:
            self._make_room(tx)
        self._insert(tx)
        return tx

    def _make_room(self, tx: Tx) -> None:
        while len(self._by_hash) + 1 > self.max_txs or self._bytes + tx.size > self.max_bytes:
            victim = self._eviction_candidate()
            if victim is None or victim.tx.fee >= tx.fee or victim.tx.sender == tx.sender:
                raise TxError(TxCode.MEMPOOL_FULL, "mempool full of transactions paying at least this fee")
            self._remove(victim.tx)

    def _eviction_candidate(self) -> _Entry | None:
        """The cheapest tail entry: lowest fee, then the account with most queued, then oldest."""
        best, best_key = None, None
        for queue in self._by_sender.values():
            tail = queue[max(queue)]
            key = (tail.tx.fee, -len(queue), tail.seq)
            if best_key is None or key < best_key:
                best, best_key = tail, key
        return best

    def _insert(self, tx: Tx) -> None:
        self._by_sender.setdefault(tx.sender, {})[tx.nonce] = _Entry(tx, next(self._arrivals), self.ledger.height)
        self._by_hash[tx.hash] = tx
        self._bytes += tx.size
        if tx.nonce == self.ledger.nonce(tx.sender):
            self._ready.add(tx.sender)

    def _remove(self, tx: Tx) -> None:
        queue = self._by_sender[tx.sender]
        del queue[tx.nonce]
        if not queue:
            del self._by_sender[tx.sender]
        del self._by_hash[tx.hash]
        self._bytes -= tx.size
        if tx.nonce == self.ledger.nonce(tx.sender):
            self._ready.discard(tx.sender)

    # ---- proposer -----------------------------------------------------------------------------

    def reap(self, max_bytes: int, max_txs: int) -> list[bytes]:
        """Ready transactions for a block: highest fee first, each account's nonces in order."""
        heap = []
        for sender, queue in self._by_sender.items():
            nonce = self.ledger.nonce(sender)
            entry = queue.get(nonce)
            if entry is not None:
                heap.append((-entry.tx.fee, entry.seq, sender, nonce))
        heapq.heapify(heap)
        out: list[bytes] = []
        used = 0
        while heap and len(out) < max_txs:
            _, _, sender, nonce = heapq.heappop(heap)
            tx = self._by_sender[sender][nonce].tx
            if used + tx.size > max_bytes:
                continue  # this account's later nonces cannot go in without this one
            out.append(tx.raw)
            used += tx.size
            following = self._by_sender[sender].get(nonce + 1)
            if following is not None:
                heapq.heappush(heap, (-following.tx.fee, following.seq, sender, nonce + 1))
        return out

    # ---- after a commit -----------------------------------------------------------------------

    def update(self, committed_tx_hashes: Iterable[bytes]) -> None:
        """Drop the committed transactions, then re-check every queued one against the new
        state: stale nonces, nonces now too far ahead, spends the balance no longer covers, and
        transactions held behind a gap for more than ``gap_ttl_blocks`` blocks."""
        for tx_hash in committed_tx_hashes:
            tx = self._by_hash.get(tx_hash)
            if tx is not None:
                self._remove(tx)
        expired_before = self.ledger.height - self.gap_ttl_blocks
        ready: set[str] = set()
        for sender in list(self._by_sender):
            queue = self._by_sender[sender]
            account_nonce = self.ledger.nonce(sender)
            budget = self.ledger.balance(sender)
            unaffordable = budget == 0  # an empty account cannot transact (ADR 0135), even at fee 0
            expected = account_nonce   # the next nonce of the ready run; past a gap it stops matching
            for nonce in sorted(queue):
                entry = queue[nonce]
                if nonce < account_nonce:
                    self._remove(entry.tx)
                    continue
                gapped = nonce != expected
                expected = nonce + 1 if not gapped else -1
                budget -= spend_of(entry.tx)
                unaffordable = unaffordable or budget < 0  # later nonces cannot run without this one
                if (unaffordable or nonce > account_nonce + self.max_nonce_ahead
                        or (gapped and entry.height < expired_before)):
                    self._remove(entry.tx)
            if account_nonce in queue:
                ready.add(sender)
        self._ready = ready

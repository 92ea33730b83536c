"""Relay admission from the ledger: ``StakeLookup`` answers the bonded stake of a registered peer
(None for a peer without a ledger record) through the node's ledger gateway (``node.ledger``),
cached for ``ttl`` seconds when the reads go over the network. A client that is no node (a task
owner's command-line client) counts as registered with no stake when its account holds at least
``min_client_balance`` tokens: it can pay for what it relays (docs/adr/0159)."""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Protocol

MAX_CACHED_PEERS = 4096


class StakeReader(Protocol):
    """What the lookup reads (``node.ledger`` is one)."""

    async def node_info(self, peer_id: str) -> dict | None: ...

    async def bonded(self, peer_id: str) -> int: ...

    async def balance(self, peer_id: str) -> int: ...


class StakeLookup:
    """Admission lookup: peer ID -> bonded stake if registered on the ledger, else None.

    Answers are cached for ``ttl`` seconds (0: never), at most MAX_CACHED_PEERS peers; a failed
    lookup raises (the relay then refuses) and is not cached.
    """

    def __init__(self, ledger: StakeReader, ttl: float, clock=time.monotonic, min_client_balance: int = 0) -> None:
        self._ledger = ledger
        self._min_client_balance = min_client_balance
        self._ttl = ttl
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, int | None]] = OrderedDict()

    async def __call__(self, peer_id: str) -> int | None:
        now = self._clock()
        hit = self._cache.get(peer_id)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        stake = None
        if await self._ledger.node_info(peer_id) is not None:
            stake = await self._ledger.bonded(peer_id)
        elif self._min_client_balance > 0 and await self._ledger.balance(peer_id) >= self._min_client_balance:
            stake = 0   # a funded client account, no node: admitted where min_stake is 0
        if self._ttl > 0:
            self._cache[peer_id] = (now, stake)
            self._cache.move_to_end(peer_id)
            while len(self._cache) > MAX_CACHED_PEERS:
                self._cache.popitem(last=False)
        return stake

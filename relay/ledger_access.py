"""The ledger as the relay wiring sees it: registrations and stake (for admission) and signed
transactions (this node's record, relay receipts).

``RelayLedger.for_node(node)`` reads from the node's own validator role when it runs one (single
lookups on the event loop, as ADR 0050 allows) and otherwise over ``[relay] ledger_rpc`` (or
``[compute] rpc_url``); it sends transactions over that URL, or the node's own JSON-RPC when it is
a validator. ``StakeLookup`` is
the relay service's admission lookup: the bonded stake of a registered peer, None for a peer
without a ledger record, cached for ``ttl`` seconds when the reads go over the network.
"""
from __future__ import annotations

import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ml.compute.ledger_client import LedgerClient, LedgerUnavailable
from node.config import ConfigError
from node.identity import Identity

if TYPE_CHECKING:
    from node.runtime import Node

MAX_CACHED_PEERS = 4096


def check_rpc_url(key: str, url: str) -> str:
    """``url`` if it is empty or an http(s) URL, else ConfigError naming ``[relay] key``."""
    parts = urllib.parse.urlsplit(url)
    if url and (parts.scheme not in ("http", "https") or not parts.netloc):
        raise ConfigError(f"[relay] {key}: {url!r} is not an http:// or https:// URL")
    return url


def validator_role_of(node: "Node"):
    """The node's validator role object, or None when it runs no validator."""
    return next((role for role in node.roles if role.name == "validator"), None)


class RelayLedger:
    """Reads from a local validator role or a JSON-RPC URL; sends over JSON-RPC."""

    def __init__(self, identity: Identity, url: str = "", validator=None,
                 own_url: Callable[[], str | None] | None = None) -> None:
        """``url``: a validator's JSON-RPC; else transactions go to ``own_url()`` (this node's)."""
        if not url and validator is None:
            raise ValueError("a ledger needs a JSON-RPC URL or a local validator role")
        self._identity = identity
        self._url = url
        self._own_url = own_url
        self.validator = validator
        self._client: LedgerClient | None = None

    @classmethod
    def for_node(cls, node: "Node") -> "RelayLedger | None":
        """The ledger this node's relay wiring uses: ``[relay] ledger_rpc``, else ``[compute]
        rpc_url`` (the validator a compute node already talks to), else the node's own validator
        role; None when it has none of them."""
        url = (check_rpc_url("ledger_rpc", node.config.get("relay", "ledger_rpc"))
               or node.config.get("compute", "rpc_url"))
        validator = validator_role_of(node)
        if not url and validator is None:
            return None
        return cls(node.identity, url, validator, lambda: node.http.url if node.http is not None else None)

    @property
    def is_local(self) -> bool:
        """Reads come from this process's ledger (no network, no cache needed)."""
        return self.validator is not None

    @property
    def url(self) -> str:
        """The JSON-RPC URL transactions go to (the node's own once its HTTP server is up)."""
        url = self._url or (self._own_url() if self._own_url is not None else None)
        if not url:
            raise LedgerUnavailable("this node serves no JSON-RPC: set [relay] ledger_rpc")
        return url

    @property
    def client(self) -> LedgerClient:
        if self._client is None:
            self._client = LedgerClient(self.url, self._identity)
        return self._client

    async def node_info(self, peer_id: str) -> dict | None:
        if self.is_local:
            self.validator.require_ready()
            return self.validator.ledger.node_info(peer_id)
        return await self.client.call("dkb_getNode", peer_id)

    async def bonded(self, peer_id: str) -> int:
        if self.is_local:
            self.validator.require_ready()
            return self.validator.ledger.stake_info(peer_id)["bonded"]
        return (await self.client.call("dkb_getStake", peer_id))["bonded"]

    async def send(self, tx_type: str, payload: dict[str, Any]) -> dict:
        """Sign with the node's key, submit, wait for the receipt (raises TxFailed, LedgerUnavailable)."""
        return await self.client.send(tx_type, payload)


class StakeLookup:
    """Admission lookup: peer ID -> bonded stake if registered on the ledger, else None.

    Answers are cached for ``ttl`` seconds (0: never), at most MAX_CACHED_PEERS peers; a failed
    lookup raises (the relay then refuses) and is not cached.
    """

    def __init__(self, ledger: RelayLedger, ttl: float, clock=time.monotonic) -> None:
        self._ledger = ledger
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
        if self._ttl > 0:
            self._cache[peer_id] = (now, stake)
            self._cache.move_to_end(peer_id)
            while len(self._cache) > MAX_CACHED_PEERS:
                self._cache.popitem(last=False)
        return stake

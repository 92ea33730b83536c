"""Peer book: what the node knows about other peers (addresses, identify results).

Plain in-memory bookkeeping with bounded sizes; the Host dials from it and identify fills it.
Relayed addresses (``<relay addr>/p2p/RELAY/p2p-circuit``) are kept like direct ones; the Host
tries them after the direct ones, through its registered circuit dialer.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from node.identity import is_valid_peer_id

from .multiaddr import Multiaddr

MAX_ADDRS_PER_PEER = 16
MAX_PEERS = 10_000


@dataclass
class PeerRecord:
    peer_id: str
    addrs: list[Multiaddr] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    agent_version: str = ""
    protocol_version: str = ""
    observed_addr: Multiaddr | None = None  # how that peer sees us
    last_seen: float = 0.0


class PeerBook:
    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self._peers: dict[str, PeerRecord] = {}
        self._max_peers = max_peers

    def _record(self, peer_id: str) -> PeerRecord:
        record = self._peers.get(peer_id)
        if record is None:
            if not is_valid_peer_id(peer_id):
                raise ValueError(f"invalid peer ID {peer_id!r}")
            if len(self._peers) >= self._max_peers:
                oldest = min(self._peers.values(), key=lambda r: r.last_seen)
                del self._peers[oldest.peer_id]
            record = self._peers[peer_id] = PeerRecord(peer_id)
        return record

    def add_addrs(self, peer_id: str, addrs: Iterable[str | Multiaddr]) -> None:
        """Remember dialable addresses (text or Multiaddr; a /p2p suffix is stripped)."""
        record = self._record(peer_id)
        for addr in addrs:
            ma = Multiaddr.parse(addr)
            if ma.peer_id is not None and ma.peer_id != peer_id:
                raise ValueError(f"address {ma} belongs to another peer than {peer_id}")
            ma = ma.without_peer_id()
            if ma in record.addrs:
                continue
            record.addrs.append(ma)
            if len(record.addrs) > MAX_ADDRS_PER_PEER:
                record.addrs.pop(0)

    def addrs(self, peer_id: str) -> list[Multiaddr]:
        record = self._peers.get(peer_id)
        return list(record.addrs) if record else []

    def get(self, peer_id: str) -> PeerRecord | None:
        return self._peers.get(peer_id)

    def update_identify(self, peer_id: str, *, listen_addrs: Iterable[Multiaddr],
                        protocols: Iterable[str], agent_version: str,
                        protocol_version: str, observed_addr: Multiaddr | None) -> None:
        record = self._record(peer_id)
        self.add_addrs(peer_id, [a for a in listen_addrs if a.peer_id in (None, peer_id)])
        record.protocols = list(protocols)
        record.agent_version = agent_version
        record.protocol_version = protocol_version
        record.observed_addr = observed_addr
        record.last_seen = time.time()

    def touch(self, peer_id: str) -> None:
        self._record(peer_id).last_seen = time.time()

    def peers(self) -> list[str]:
        return list(self._peers)

    def __contains__(self, peer_id: str) -> bool:
        return peer_id in self._peers

    def __len__(self) -> int:
        return len(self._peers)

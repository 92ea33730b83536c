"""Connection admission policy of a Host, without I/O (in the spirit of libp2p's resource manager
and connection manager; docs/adr/0145).

- ``pending_pool``: inbound sockets still upgrading, a node/admission.py pool (ADR 0186): capped in
  all, per source IP and per address prefix; a full pool evicts the oldest pending socket of the
  most-represented prefix and IP (or one pending longer than an honest handshake takes); sockets
  from a protected peer's known address use reserved capacity.
- ``Protector``: peers that must never be evicted, each under one or more tags (``"committee"``,
  ``"bootstrap"``); a peer stays protected while any tag holds it.
- ``pick_victim``: when the inbound budget is full, which inbound connection a new authenticated
  one evicts: one of an unprotected peer, idle ones (no open streams) before busy ones, the one
  longest without a new stream first; None when every candidate is protected (then the new
  connection is refused).

Inbound and outbound connections have separate budgets (HostLimits), so a node's own dials never
fail because inbound filled up.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from node.admission import Pool, PoolLimits

from .limits import HostLimits


def pending_pool(limits: HostLimits, clock: Callable[[], float]) -> Pool:
    """The pool of inbound sockets still in their handshake; a source IP is a socket's peer."""
    total = limits.max_pending_inbound
    return Pool(PoolLimits(total=total, per_peer=limits.max_pending_inbound_per_ip,
                           unknown_pool=max(1, total - limits.pending_inbound_reserved),
                           per_prefix=limits.max_pending_inbound_per_prefix,
                           grace=limits.pending_inbound_grace), clock)


@dataclass
class Protector:
    """Peer IDs that are never evicted, by tag."""

    _tags: dict[str, set[str]] = field(default_factory=dict)  # peer ID -> tags

    def protect(self, peer_id: str, tag: str) -> None:
        self._tags.setdefault(peer_id, set()).add(tag)

    def unprotect(self, peer_id: str, tag: str) -> bool:
        """Drop ``tag`` from ``peer_id``; True if the peer is still protected by another tag."""
        tags = self._tags.get(peer_id)
        if tags is None:
            return False
        tags.discard(tag)
        if not tags:
            del self._tags[peer_id]
            return False
        return True

    def set_tag(self, tag: str, peer_ids: Iterable[str]) -> None:
        """Make exactly ``peer_ids`` hold ``tag`` (e.g. the current committee)."""
        wanted = set(peer_ids)
        for peer_id in [p for p, tags in self._tags.items() if tag in tags and p not in wanted]:
            self.unprotect(peer_id, tag)
        for peer_id in wanted:
            self.protect(peer_id, tag)

    def is_protected(self, peer_id: str) -> bool:
        return peer_id in self._tags

    def peers(self) -> list[str]:
        return list(self._tags)

    def tags(self, peer_id: str) -> frozenset[str]:
        return frozenset(self._tags.get(peer_id, ()))


class EvictionCandidate(Protocol):
    @property
    def remote_peer(self) -> str: ...

    @property
    def num_streams(self) -> int: ...

    @property
    def last_active(self) -> float: ...


C = TypeVar("C", bound=EvictionCandidate)


def pick_victim(candidates: Iterable[C], is_protected: Callable[[str], bool],
                class_of: Callable[[str], int] = lambda _peer: 0) -> C | None:
    """The connection to evict for a new one: unprotected, lowest admission class first (unknown before
    staked or business, ADR 0197), idle before busy, longest inactive first."""
    eligible = [c for c in candidates if not is_protected(c.remote_peer)]
    if not eligible:
        return None
    return min(eligible, key=lambda c: (class_of(c.remote_peer), c.num_streams > 0, c.last_active))

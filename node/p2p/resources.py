"""Connection admission policy of a Host, without I/O (in the spirit of libp2p's resource manager
and connection manager; docs/adr/0145).

- ``PendingInbound``: inbound sockets still upgrading, capped in all and per source IP, so one
  address cannot fill the pending pool (each pending socket also has the handshake deadline).
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


class PendingInbound:
    """Inbound sockets not yet authenticated: at most ``total`` in all and ``per_ip`` per address."""

    def __init__(self, total: int, per_ip: int) -> None:
        self.total = total
        self.per_ip = per_ip
        self._by_ip: dict[str, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def count(self, ip: str) -> int:
        return self._by_ip.get(ip, 0)

    def try_add(self, ip: str) -> bool:
        """Admit one more pending socket from ``ip``; False (not counted) when a cap is reached."""
        if self._count >= self.total or self._by_ip.get(ip, 0) >= self.per_ip:
            return False
        self._by_ip[ip] = self._by_ip.get(ip, 0) + 1
        self._count += 1
        return True

    def remove(self, ip: str) -> None:
        held = self._by_ip.get(ip, 0)
        if held <= 0:
            return
        if held == 1:
            del self._by_ip[ip]
        else:
            self._by_ip[ip] = held - 1
        self._count -= 1

    def clear(self) -> None:
        self._by_ip.clear()
        self._count = 0


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


def pick_victim(candidates: Iterable[C], is_protected: Callable[[str], bool]) -> C | None:
    """The connection to evict for a new one: unprotected, idle before busy, longest inactive first."""
    eligible = [c for c in candidates if not is_protected(c.remote_peer)]
    if not eligible:
        return None
    return min(eligible, key=lambda c: (c.num_streams > 0, c.last_active))

"""When to try a hole punch again for a peer that stayed relayed (issue 25 item 4, docs/adr/0225).

A punch that failed may work later: the peer's NAT mapping expired and a fresh one is punchable, the
peer moved to another network, a router got a port mapping or IPv6, a symmetric NAT's counter met
ours. Every relayed byte costs the relay's operator twice, so a relayed peer is punched again, with
exponential backoff: ``first_s`` after the failure, then twice as long each time, at most ``max_s``;
the schedule forgets a peer once it is reached directly or its relayed connection closes.

``RepunchSchedule`` is a pure state machine over a clock the caller passes in (seconds): ``failed``,
``succeeded`` and ``forget`` record what happened, ``due(now)`` says which peers to punch now (and
marks them in progress until the caller reports back). ``relay/node_punch.py`` drives it.
"""
from __future__ import annotations

from dataclasses import dataclass

FIRST_S = 30.0        # the first retry after a failed punch
MAX_S = 900.0         # the longest wait between retries (15 min)
MAX_PEERS = 1024      # relayed peers tracked at most (the oldest entry goes first)


@dataclass
class _Entry:
    next_at: float
    wait_s: float
    attempts: int = 0
    running: bool = False


class RepunchSchedule:
    def __init__(self, first_s: float = FIRST_S, max_s: float = MAX_S, max_peers: int = MAX_PEERS) -> None:
        self.first_s, self.max_s, self.max_peers = first_s, max_s, max_peers
        self._peers: dict[str, _Entry] = {}

    def __contains__(self, peer: str) -> bool:
        return peer in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def failed(self, peer: str, now: float) -> None:
        """A punch to ``peer`` failed (or the peer stayed relayed): try again after the next wait."""
        entry = self._peers.get(peer)
        if entry is None:
            if len(self._peers) >= self.max_peers:
                self._peers.pop(next(iter(self._peers)))
            self._peers[peer] = _Entry(now + self.first_s, self.first_s)
            return
        entry.attempts += 1
        entry.wait_s = min(self.max_s, entry.wait_s * 2)
        entry.next_at = now + entry.wait_s
        entry.running = False

    def succeeded(self, peer: str) -> None:
        """``peer`` is reached directly: nothing more to schedule."""
        self._peers.pop(peer, None)

    forget = succeeded   # the relayed connection closed: nothing to upgrade any more

    def due(self, now: float) -> list[str]:
        """The peers whose retry is due now (marked in progress until ``failed`` or ``succeeded``)."""
        out = [peer for peer, entry in self._peers.items() if not entry.running and entry.next_at <= now]
        for peer in out:
            self._peers[peer].running = True
        return out

    def attempts(self, peer: str) -> int:
        entry = self._peers.get(peer)
        return entry.attempts if entry is not None else 0

    def next_at(self, peer: str) -> float | None:
        entry = self._peers.get(peer)
        return None if entry is None else entry.next_at

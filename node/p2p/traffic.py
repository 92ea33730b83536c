"""Byte counts of negotiated p2p streams, by protocol, direction (in/out) and path (direct or
relayed), kept as plain integers on the event loop and exported by the node as metrics."""
from __future__ import annotations

TrafficKey = tuple[str, str, str]   # (protocol, "in" | "out", "direct" | "relayed")

MAX_PROTOCOLS = 64       # a peer can negotiate many names; counts past this go under "other"


class Traffic:
    """Counters of stream payload bytes; ``add`` is called per read/write, so it stays a dict bump."""

    def __init__(self) -> None:
        self.bytes: dict[TrafficKey, int] = {}
        self._protocols: set[str] = set()

    def add(self, protocol: str | None, direction: str, relayed: bool, n: int) -> None:
        if n <= 0:
            return
        name = protocol or "negotiating"
        if name not in self._protocols:
            if len(self._protocols) >= MAX_PROTOCOLS:
                name = "other"
            else:
                self._protocols.add(name)
        key = (name, direction, "relayed" if relayed else "direct")
        self.bytes[key] = self.bytes.get(key, 0) + n

    def snapshot(self) -> dict[TrafficKey, int]:
        return dict(self.bytes)

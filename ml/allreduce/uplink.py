"""Takes turns on this peer's uplink: one piece at a time, writers served in the order they asked.

A butterfly sends to every other member at once. Left to themselves, those TCP flows share the
uplink (and each receiver's downlink) unevenly: on 100 Mbit/s links the all-to-all traffic ran at
~80% of the link against ~95% for one flow per link. Writing one piece (at most links.TURN_BYTES)
at a time, in rotation over the destinations, while the socket keeps little unsent data
(TCP_NOTSENT_LOWAT, transport.py), gives every flow its share piece by piece and keeps the others'
connections warm (ADR 0097).

A destination that stops reading must not stall the others: a turn ends after `hold_s` even if
its write has not returned; that write goes on outside the rotation. `hold_s` follows the
observed write times (a multiple of their recent median, within bounds), so slow links do not
lose the rotation; a frozen peer costs at most one hold. Frames that leave one by one do not all
take the median time (a receiver's downlink is shared with other senders): holds of 4x the median
(~50 ms on the benchmark links) ended healthy turns and cost 0.1-0.2 s per round. Serving waiting
writers by frame kind (every destination's parts before any results) measured no better than
plain rotation.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Awaitable, Callable

HOLD_FACTOR = 8.0      # a turn lasts at most this many recent median write times ...
HOLD_FLOOR_S = 0.5     # ... but at least this long (shorter holds cut healthy turns: ADR 0097)
HOLD_CEIL_S = 2.0      # ... and at most this long
HOLD_INITIAL_S = 0.5   # before any write was timed
RECENT_WRITES = 16


class UplinkTurn:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()  # wakes waiters in FIFO order: a rotation over the writers
        self._recent: deque[float] = deque(maxlen=RECENT_WRITES)
        self.expired_turns = 0       # turns ended by the hold limit (a destination not reading)

    @property
    def hold_s(self) -> float:
        if not self._recent:
            return HOLD_INITIAL_S
        return min(max(HOLD_FACTOR * statistics.median(self._recent), HOLD_FLOOR_S), HOLD_CEIL_S)

    async def write(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run `write` (one piece of a frame) in this writer's turn."""
        await self._lock.acquire()
        released = False

        def release(expired: bool = False) -> None:
            nonlocal released
            if not released:
                released = True
                self.expired_turns += expired
                self._lock.release()

        timer = asyncio.get_running_loop().call_later(self.hold_s, release, True)
        start = time.monotonic()
        try:
            await write()
            if not released:
                self._recent.append(time.monotonic() - start)
        finally:
            timer.cancel()
            release()

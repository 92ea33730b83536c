"""Adaptive stall detection: how long a transfer may go without progress before its path is dead.

``StallTimer`` learns the usual gap between progress reports (a smoothed mean and mean deviation,
as TCP's retransmission timer does for round trips) and allows ``factor`` times the mean plus four
deviations, never less than ``floor`` nor more than ``cap``; before the first gap is seen it allows
``initial``. A silent path on a link whose reports come every quarter second is thus given up after
about ``floor`` seconds, while a slow link whose reports are seconds apart earns a longer allowance.
"""
from __future__ import annotations

from dataclasses import dataclass

FLOOR_S = 1.0
CAP_S = 10.0
INITIAL_S = 2.0     # before the first report: its interval plus a round trip, with room
FACTOR = 4.0
GAIN = 0.25  # weight of a new gap in the smoothed mean and deviation


@dataclass
class StallTimer:
    floor: float = FLOOR_S
    cap: float = CAP_S
    initial: float = INITIAL_S
    factor: float = FACTOR
    smoothed: float | None = None
    deviation: float = 0.0

    def observe(self, gap: float) -> None:
        """Record ``gap`` seconds between two signs of progress."""
        if self.smoothed is None:
            self.smoothed, self.deviation = gap, gap / 2
            return
        self.deviation += GAIN * (abs(gap - self.smoothed) - self.deviation)
        self.smoothed += GAIN * (gap - self.smoothed)

    @property
    def timeout(self) -> float:
        """Seconds without progress after which the path counts as dead."""
        if self.smoothed is None:
            return self.initial
        return min(self.cap, max(self.floor, self.factor * self.smoothed + 4 * self.deviation))


class FixedStall:
    """A stall timeout that does not adapt (``send_resumable(stall_timeout=...)``)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def observe(self, gap: float) -> None:
        pass

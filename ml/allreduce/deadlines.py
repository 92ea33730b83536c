"""Adaptive stall deadlines from observed chunk timings.

A peer is declared stalled when nothing arrived from it for `stall_timeout()` seconds while we
waited on it. The timeout is `multiplier` times a moving average of the gaps observed between
consecutive frames of one sender within one attempt, clamped to [floor_s, ceiling_s]; before any
observation it is `initial_s`. It is never infinite.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeadlinePolicy:
    floor_s: float = 2.0
    multiplier: float = 8.0
    ceiling_s: float = 30.0
    initial_s: float = 5.0
    first_frame_grace_s: float = 5.0  # extra time for a member's first frame of a round (late start)
    smoothing: float = 0.2            # weight of a new gap in the moving average

    def __post_init__(self) -> None:
        if not 0 < self.floor_s <= self.ceiling_s or self.initial_s <= 0 or self.multiplier <= 0:
            raise ValueError("deadline policy needs 0 < floor <= ceiling, initial > 0, multiplier > 0")


class StallEstimator:
    """Tracks the moving average of inter-frame gaps and turns it into a stall timeout."""

    def __init__(self, policy: DeadlinePolicy) -> None:
        self.policy = policy
        self._avg_gap: float | None = None

    def observe_gap(self, seconds: float) -> None:
        if seconds < 0:
            return
        if self._avg_gap is None:
            self._avg_gap = seconds
        else:
            a = self.policy.smoothing
            self._avg_gap = (1 - a) * self._avg_gap + a * seconds

    def stall_timeout(self) -> float:
        p = self.policy
        if self._avg_gap is None:
            return p.initial_s
        return min(max(p.multiplier * self._avg_gap, p.floor_s), p.ceiling_s)

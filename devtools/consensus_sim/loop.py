"""A deterministic asyncio event loop on virtual time, and the consensus clock that runs on it.

``VirtualTimeLoop`` is a ``SelectorEventLoop`` whose selector never waits: when nothing is ready it
jumps the clock to the next timer. There is no real I/O, no threads (``SimClock.offload`` runs the
call inline), so callbacks run in an order fixed by the program and its seeded RNG: a seed replays
exactly, and hours of simulated time take seconds.
"""
from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable
from typing import Any

from consensus.clock import LoopClock


class SimulationStalled(RuntimeError):
    """Nothing is ready and no timer is pending: the simulated world has stopped."""


class _VirtualSelector(selectors.SelectSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None):
        if timeout is None:
            raise SimulationStalled("no callback ready and no timer pending")
        if timeout > 0:
            self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual.now


class SimClock(LoopClock):
    """The production clock on the virtual-time loop, but blocking work runs inline (no threads)."""

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

"""The consensus driver's clock port: a time source, timers and sleeps, and where blocking work runs.

``Clock``: ``now()`` (monotonic seconds), ``call_later(delay, fn, *args)`` (a handle with
``cancel()``), ``await sleep(delay)`` and ``await offload(fn, *args)`` (run a blocking call, e.g.
signature checks, without stalling the loop). ``LoopClock`` is production: the running asyncio
loop's clock and timers, and its default thread pool for ``offload``. The deterministic simulator
runs the same driver on a virtual-time loop and offloads inline, so a seed replays exactly.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> Any: ...

    async def sleep(self, delay: float) -> None: ...

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class LoopClock:
    """Production ``Clock``: the running loop's monotonic time and timers; threads for blocking work."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, fn, *args)

    async def sleep(self, delay: float) -> None:
        await asyncio.sleep(delay)

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

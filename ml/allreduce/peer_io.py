"""What the pieces of an all-reduce group share: this peer, the membership, the outgoing links,
the inbox, the stall estimate, the worker threads for tensor work and the background sends.

`AllReduceGroup` (group.py) builds one and hands it to the attempt runner (attempt_runner.py), the
VIEW exchange (view_exchange.py) and the committed-result exchange (committed_exchange.py).
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .deadlines import StallEstimator
from .inbox import Inbox
from .links import PeerLinks

T = TypeVar("T")


@dataclass
class PeerIO:
    me: str
    links: PeerLinks
    inbox: Inbox
    estimator: StallEstimator
    pool: ThreadPoolExecutor
    chunk_numel: int                       # the pipelining unit (committed results are sent in chunks of it)
    peers: list[str] = field(default_factory=list)   # the agreed membership, sorted (set by the group)
    background: set[asyncio.Task[None]] = field(default_factory=set)

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking tensor work in the pool (torch releases the GIL), not on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a send in the background (cancelled by `cancel_background`)."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def cancel_background(self) -> None:
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)

"""Training progress reports (step, loss, bytes sent) and a feed that fans them out.

Trainers publish `TrainProgress` events on the event loop; the CLI and RPC either register a callback
or iterate `feed.stream()` (an async iterator that ends when the feed closes).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TrainProgress:
    rank: int
    step: int                 # optimizer steps done by this worker (inner steps for DiLoCo)
    loss: float               # mean training loss since the previous report
    bytes_sent: int           # total bytes this worker has sent to the group so far
    participants: int         # peers in the last averaging round
    outer_step: int | None = None   # DiLoCo outer steps done
    metrics: dict[str, float] = field(default_factory=dict)  # evaluation, when one was run
    compute_s: float = 0.0    # seconds of training computation so far (utilization = this / training wall time)

    def to_dict(self) -> dict:
        return asdict(self)


_CLOSED = object()


class ProgressFeed:
    """Fan-out of progress events to callbacks and async-iterator subscribers."""

    def __init__(self, history: int = 0) -> None:
        self._callbacks: list[Callable[[TrainProgress], None]] = []
        self._queues: list[asyncio.Queue] = []
        self._history_limit = history
        self.history: list[TrainProgress] = []
        self.closed = False

    def subscribe(self, callback: Callable[[TrainProgress], None]) -> None:
        self._callbacks.append(callback)

    def publish(self, event: TrainProgress) -> None:
        if self._history_limit:
            self.history.append(event)
            del self.history[:-self._history_limit]
        for callback in self._callbacks:
            callback(event)
        for queue in self._queues:
            queue.put_nowait(event)

    def close(self) -> None:
        self.closed = True
        for queue in self._queues:
            queue.put_nowait(_CLOSED)

    async def stream(self) -> AsyncIterator[TrainProgress]:
        """Events published from now on, until `close()`."""
        queue: asyncio.Queue = asyncio.Queue()
        self._queues.append(queue)
        try:
            while not self.closed or not queue.empty():
                event = await queue.get()
                if event is _CLOSED:
                    return
                yield event
        finally:
            self._queues.remove(queue)

"""A bounded, lossy frame queue to one peer over one long-lived stream (for gossip protocols).

`send` never blocks: when the queue is full the oldest frame is dropped, since gossip protocols
(consensus votes, transaction batches) recover lost frames by re-sending. A task writes queued frames
to a stream it opens on demand; a failed open or write drops the stream and retries with backoff.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import HostStream
    from .host import Host

log = logging.getLogger(__name__)


class PeerSender:
    def __init__(self, host: Host, peer_id: str, protocol: str, max_queue: int, open_timeout: float) -> None:
        self.host = host
        self.peer_id = peer_id
        self.protocol = protocol
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(max_queue)
        self.open_timeout = open_timeout
        self.stream: HostStream | None = None
        self.task = asyncio.get_running_loop().create_task(self._run())

    def send(self, data: bytes) -> None:
        if self.queue.full():
            self.queue.get_nowait()  # drop the oldest; the protocol's re-sending recovers it
        self.queue.put_nowait(data)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            data = await self.queue.get()
            try:
                if self.stream is None:
                    self.stream = await asyncio.wait_for(
                        self.host.open_stream(self.peer_id, self.protocol), self.open_timeout)
                await self.stream.write(data)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the peer is down or the stream broke: drop, retry later
                log.debug("%s send to %s failed: %s", self.protocol, self.peer_id, exc)
                await self._drop_stream()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _drop_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                await stream.close()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        await self._drop_stream()

"""Outgoing frames: one stream per peer, fed by a bounded queue and drained by one writer task.

A single writer per peer keeps frames whole on the stream (cancelling an attempt never cuts a
frame in half) and gives back-pressure: `send` waits while the queue is full. The queue serves
earlier rounds first and, within an attempt, parts before results; the writers take turns on the
uplink, one piece of at most `TURN_BYTES` at a time (uplink.py, docs/adr/0097). Data frames (PART,
RESULT) of an attempt that this peer abandoned are skipped rather than sent; those of an attempt it
committed are always sent, even after it moved on to later rounds: slower members still need them
to finish that attempt (docs/adr/0090). A stream that cannot be opened or written marks the peer
faulty through `on_broken`.

A stream whose connection is going away (a relayed one retired after a hole punch: it takes no new
streams and is reset once its drain time is up) is moved between frames, busy or idle: the writer
opens the next stream (on the peer's current connection), ends the old one and waits until the peer
has read it to its end (the peer closes its side there) before writing on the new one, so every
frame arrives once and in order (docs/adr/0233).

A peer no connection could be made to (`PeerUnreachable`: it died, and every dial to it fails, often
only after a connect timeout of seconds) is not dialed again for a backoff of `BACKOFF_FIRST_S`, doubling up to
`BACKOFF_MAX_S`: until then a link to it fails at once, so each round after a member died fails its
first attempt at once instead of after a dial timeout (docs/adr/0238). A stream opened to it, or one it
opened to us (`reachable`), ends the backoff.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any

from .transport import PeerUnreachable, Stream, Transport, going_away, is_going_away
from .uplink import UplinkTurn
from .wire import Frame, Kind, encode_frame

QUEUE_FRAMES = 8
KEEP_ABANDONED_ROUNDS = 4  # abandoned attempts are remembered for this many recent rounds
OPEN_TIMEOUT_S = 10.0
BACKOFF_FIRST_S = 2.0    # after a failed open, the peer is not dialed again for this long...
BACKOFF_MAX_S = 60.0     # ...doubling after each further failed open, up to this
MOVE_TIMEOUT_S = 60.0  # the most a moved stream's end may take to be read (its connection's drain ends it first)
DATA_KINDS = (Kind.PART, Kind.RESULT)
TURN_BYTES = 256 << 10  # the most one turn on the uplink writes (a large frame takes several turns)
# order within a peer's queue: earlier rounds and attempts first; within one, control frames
# (PING, VIEW), then contribution parts (they unblock the reducers), then results
_RANK = {Kind.PART: 1, Kind.RESULT: 2, Kind.COMMITTED: 2}
Entry = tuple[int, int, int, int, Frame]   # (round, attempt, rank, sequence, frame): the queue's order


class PeerLinks:
    def __init__(self, transport: Transport, protocol: str, on_broken: Callable[[str, str], None]):
        self._transport = transport
        self._protocol = protocol
        self._on_broken = on_broken
        self._queues: dict[str, asyncio.PriorityQueue[Entry]] = {}
        self._writers: set[asyncio.Task[None]] = set()
        self._abandoned: dict[int, set[int]] = {}  # round -> attempts whose data frames are skipped
        self._close_grace_s = 1.0
        self.bytes_sent = 0
        self._seq = 0  # queue entries' tie-breaker: FIFO within one rank
        self.uplink = UplinkTurn()
        self._backoff: dict[str, tuple[float, float, str]] = {}   # peer -> (not before, last delay, why)

    def reachable(self, peer: str) -> None:
        """``peer`` opened a stream to us: dial it again at once if a link is needed."""
        self._backoff.pop(peer, None)

    async def _open(self, peer: str) -> Stream:
        """A stream to ``peer``, or an error: at once while its backoff runs, else the open's own."""
        now = asyncio.get_running_loop().time()
        until, delay, why = self._backoff.get(peer, (0.0, 0.0, ""))
        if now < until:
            raise ConnectionError(f"not dialed again for {until - now:.1f} s: {why}")
        try:
            stream = await asyncio.wait_for(self._transport.open_stream(peer, self._protocol), OPEN_TIMEOUT_S)
        except (PeerUnreachable, TimeoutError) as exc:   # not a peer that is up but not serving us yet
            delay = min(BACKOFF_MAX_S, delay * 2 if delay else BACKOFF_FIRST_S)
            self._backoff[peer] = (asyncio.get_running_loop().time() + delay, delay,
                                   f"{type(exc).__name__}: {exc}"[:300])
            raise
        self._backoff.pop(peer, None)
        return stream

    def abandon(self, round_id: int, attempt: int) -> None:
        """Skip the data frames of this attempt still queued (it failed or was superseded here)."""
        self._abandoned.setdefault(round_id, set()).add(attempt)
        for old in sorted(self._abandoned)[:-KEEP_ABANDONED_ROUNDS]:
            del self._abandoned[old]

    def is_abandoned(self, frame: Frame) -> bool:
        return frame.kind in DATA_KINDS and frame.attempt in self._abandoned.get(frame.round_id, ())

    def _queue(self, peer: str) -> asyncio.PriorityQueue[Entry]:
        queue = self._queues.get(peer)
        if queue is None:
            queue = self._queues[peer] = asyncio.PriorityQueue(QUEUE_FRAMES)
            self._writers.add(asyncio.create_task(self._write_loop(peer, queue)))
        return queue

    def _entry(self, frame: Frame) -> Entry:
        self._seq += 1
        return (frame.round_id, frame.attempt, _RANK.get(frame.kind, 0), self._seq, frame)

    async def send(self, peer: str, frame: Frame) -> None:
        await self._queue(peer).put(self._entry(frame))

    def send_nowait(self, peer: str, frame: Frame) -> bool:
        """Queue a frame if there is room right now (for PINGs: a busy link shows life anyway)."""
        queue = self._queue(peer)
        if queue.full():
            return False
        queue.put_nowait(self._entry(frame))
        return True

    async def flush(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until every queued frame was written or dropped."""
        joins = [asyncio.ensure_future(q.join()) for q in self._queues.values()]
        if joins:
            _, pending = await asyncio.wait(joins, timeout=timeout)
            for join in pending:
                join.cancel()

    async def close(self, grace_s: float = 1.0) -> None:
        """Stop the writers; each closes its stream, waiting up to `grace_s` for buffered bytes
        to leave."""
        self._close_grace_s = grace_s
        for task in self._writers:
            task.cancel()
        if self._writers:
            await asyncio.wait(self._writers)
        self._writers.clear()
        self._queues.clear()

    async def _write_loop(self, peer: str, queue: asyncio.PriorityQueue[Entry]) -> None:
        stream = None
        try:
            while True:
                entry = await _next_entry(queue, stream)  # None: the stream's connection goes away
                try:
                    if stream is not None and is_going_away(stream):
                        stream = await self._move(peer, stream)
                    if entry is None or self.is_abandoned(frame := entry[-1]):
                        continue
                    if stream is None:
                        stream = await self._open(peer)
                    buffers = encode_frame(frame)
                    for piece in _pieces(buffers, TURN_BYTES):
                        await self.uplink.write(functools.partial(_write_all, stream, piece))
                    self.bytes_sent += sum(len(b) for b in buffers)
                finally:
                    if entry is not None:
                        queue.task_done()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any stream failure means the link is gone
            if self._queues.get(peer) is queue:
                del self._queues[peer]  # the next send opens a fresh link
            if stream is not None:
                stream.reset()
            self._on_broken(peer, f"link failed: {type(exc).__name__}: {exc}")
            while True:  # frames already queued here are undeliverable: discard, never block senders
                await queue.get()
                queue.task_done()
        finally:
            if stream is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(stream.close(), self._close_grace_s)

    async def _move(self, peer: str, old: Stream) -> Stream:
        """The next stream to ``peer``, once ``old`` (whose connection goes away) was read to its end."""
        new = await asyncio.wait_for(self._transport.open_stream(peer, self._protocol), OPEN_TIMEOUT_S)
        try:
            await asyncio.wait_for(_end(old), MOVE_TIMEOUT_S)
        except BaseException:
            new.reset()
            raise
        return new


async def _next_entry(queue: asyncio.PriorityQueue[Entry], stream: Stream | None) -> Entry | None:
    """The next queued entry; None if, while none is queued, ``stream``'s connection starts going away."""
    event = going_away(stream) if stream is not None else None
    if event is None or not queue.empty():
        return await queue.get()
    if event.is_set():
        return None
    getter = asyncio.ensure_future(queue.get())
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((getter, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not getter.done():
            getter.cancel()  # an entry it was about to take stays queued (asyncio.Queue.get)
    return getter.result() if getter.done() else None


async def _end(stream: Stream) -> None:
    """End our side of ``stream`` and wait for the peer's end: it has read every byte we wrote."""
    await stream.close()
    while await stream.read(1 << 16):
        pass  # the peer writes nothing on an all-reduce link


async def _write_all(stream: Stream, buffers: list[Any]) -> None:
    for buf in buffers:
        await stream.write(buf)


def _pieces(buffers: list[Any], limit: int) -> list[list[memoryview]]:
    """The frame's buffers regrouped into pieces of at most `limit` bytes (views, no copies)."""
    pieces, piece, size = [], [], 0
    for buf in buffers:
        view = memoryview(buf)  # one-byte items (wire.payload_parts)
        while len(view):
            take = view[:limit - size]
            piece.append(take)
            size += len(take)
            view = view[len(take):]
            if size == limit:
                pieces.append(piece)
                piece, size = [], 0
    if piece:
        pieces.append(piece)
    return pieces

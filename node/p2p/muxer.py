"""asyncio driver for the yamux session core: one MuxedConnection over one secured connection.

It runs three tasks per connection: a reader (conn.read -> YamuxSession.receive_data -> wake stream
waiters, never blocked by our own sending), a sender (the only caller of conn.write, which batches
everything queued into one write) and a keepalive (pings an idle connection, closes it when the
peer stays silent). Inbound streams go to `on_stream` in their own task. Protocol logic lives in
node.p2p.yamux; this module only moves bytes and wakes waiters.

Back-pressure: `YamuxStream.write` waits for yamux send window and for room in the connection's
outbound queue (bounded by OUTBOUND_HIGH_WATER), so a slow reader slows the writer and nothing is
buffered without bound; unread received data per stream is bounded by the window we advertised.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from node.p2p.yamux import (
    DEFAULT_MAX_FRAME_PAYLOAD,
    DEFAULT_MAX_STREAMS,
    DEFAULT_WINDOW_GROWTH_BUDGET,
    GO_AWAY_NORMAL,
    MAX_WINDOW,
    DataReceived,
    GoAwayReceived,
    PongReceived,
    SendWindowOpened,
    StreamEnded,
    StreamOpened,
    StreamReset,
    WindowTuner,
    YamuxEvent,
    YamuxProtocolError,
    YamuxSession,
    YamuxSessionClosed,
)

log = logging.getLogger(__name__)

# Writers wait while this many bytes are queued for the connection and not yet taken by the sender.
OUTBOUND_HIGH_WATER = 1024 * 1024
# The reader stops reading while our queue exceeds this (a peer flooding pings it never reads).
READER_PAUSE_THRESHOLD = 8 * 1024 * 1024
# A read returns a first buffered chunk of at least this size alone instead of joining more.
_COALESCE_BELOW = 16 * 1024
DEFAULT_KEEPALIVE_INTERVAL = 30.0
DEFAULT_KEEPALIVE_TIMEOUT = 30.0
_CLOSE_FLUSH_TIMEOUT = 1.0


class SecuredConnection(Protocol):
    """What the muxer needs from the layer below (noise, or any ordered reliable byte pipe)."""

    async def read(self) -> bytes | memoryview: ...  # next chunk, arbitrary boundaries; b"" at EOF

    async def write(self, data: list[bytes | memoryview]) -> None: ...  # send these, in order

    async def close(self) -> None: ...


class StreamResetError(ConnectionResetError):
    """The stream was reset by either side, or its connection was lost."""


class MuxerClosedError(ConnectionError):
    """The connection is closed, or a GoAway forbids new streams."""


class YamuxStream:
    """One yamux stream: asyncio reads and writes with window back-pressure."""

    __slots__ = ("stream_id", "_muxer", "_chunks", "_offset", "_buffered", "_eof", "_reset",
                 "_write_closed", "_writing", "_read_waiter", "_window_waiter")
    # received chunks are bytes or memoryviews over the connection's decrypted reads (no copy
    # until a read hands them out as bytes)

    def __init__(self, muxer: MuxedConnection, stream_id: int) -> None:
        self.stream_id = stream_id
        self._muxer = muxer
        self._chunks: deque[bytes | memoryview] | None = None  # created on first data (idle streams stay small)
        self._offset = 0  # bytes of _chunks[0] already read
        self._buffered = 0
        self._eof = False
        self._reset = False
        self._write_closed = False
        self._writing = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._window_waiter: asyncio.Future[None] | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet (never more than the window we advertised)."""
        return self._buffered

    async def read(self, n: int = -1) -> bytes:
        """Return up to `n` bytes (n < 0: what is buffered), waiting for at least one; b"" at EOF.

        One reader at a time: a second task waiting concurrently gets RuntimeError.
        """
        if n == 0:
            return b""
        while not self._buffered:
            if self._reset:
                raise StreamResetError(f"yamux stream {self.stream_id} was reset")
            if self._eof:
                return b""
            if self._read_waiter is not None:
                raise RuntimeError(f"yamux stream {self.stream_id}: another task is already reading")
            self._read_waiter = self._muxer._loop.create_future()
            try:
                await self._read_waiter
            finally:
                self._read_waiter = None
        if self._reset:
            raise StreamResetError(f"yamux stream {self.stream_id} was reset")
        data = self._take(n)
        self._muxer._acknowledge(self.stream_id, len(data))
        return data

    async def readexactly(self, n: int) -> bytes:
        """Return exactly `n` bytes; asyncio.IncompleteReadError if EOF comes first."""
        parts: list[bytes] = []
        got = 0
        while got < n:
            chunk = await self.read(n - got)
            if not chunk:
                raise asyncio.IncompleteReadError(b"".join(parts), n)
            parts.append(chunk)
            got += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data`, waiting for send window and outbound room (back-pressure).

        Nothing is copied: the queued frames reference `data`. bytes return once queued; a
        mutable buffer (bytearray, memoryview, any contiguous buffer) returns only once the
        connection has taken its last frame, so the caller may reuse it as soon as this returns.
        One writer at a time: a second task writing concurrently gets RuntimeError.
        """
        if self._writing:
            raise RuntimeError(f"yamux stream {self.stream_id}: another task is already writing")
        borrowed = type(data) is not bytes
        view = memoryview(data)
        if borrowed:
            if view.c_contiguous:
                view = view.cast("B")
            else:  # not one contiguous block: send a contiguous copy
                view, borrowed = memoryview(view.tobytes()), False
        self._writing = True
        try:
            await self._write_all(view)
            if borrowed:
                await self._muxer._wait_taken()
                self._check_writable()
        finally:
            self._writing = False

    async def _write_all(self, view: memoryview) -> None:
        muxer = self._muxer
        session = muxer._session
        pos = 0
        total = len(view)
        has_turn = False  # writers take turns at the outbound queue, in arrival order
        try:
            while pos < total:
                self._check_writable()
                if session.outbound_size >= OUTBOUND_HIGH_WATER or (muxer._room_waiters and not has_turn):
                    has_turn = False
                    await muxer._wait_outbound_turn()
                    has_turn = True
                    continue
                sent = session.send_data(self.stream_id, view[pos:pos + OUTBOUND_HIGH_WATER])
                if sent:
                    pos += sent
                    muxer._wake_sender()
                    continue
                if has_turn:  # no send window: let the next writer use the room meanwhile
                    has_turn = False
                    muxer._pass_turn()
                self._window_waiter = muxer._loop.create_future()
                try:
                    await self._window_waiter
                finally:
                    self._window_waiter = None
        finally:
            if has_turn:
                muxer._pass_turn()

    async def close(self) -> None:
        """Half-close: send FIN; reading continues until the peer's FIN."""
        if self._write_closed or self._reset:
            return
        self._write_closed = True
        muxer = self._muxer
        if not muxer.closed:
            muxer._session.end_stream(self.stream_id)
            muxer._wake_sender()
            muxer._forget_if_finished(self)

    def reset(self) -> None:
        """Abort the stream in both directions (RST); pending reads and writes raise."""
        if self._reset:
            return
        muxer = self._muxer
        if not muxer.closed:
            muxer._session.reset_stream(self.stream_id)
            muxer._wake_sender()
        muxer._drop_stream(self.stream_id)
        self._on_reset()

    def _check_writable(self) -> None:
        if self._reset:
            raise StreamResetError(f"yamux stream {self.stream_id} was reset")
        if self._write_closed:
            raise BrokenPipeError(f"yamux stream {self.stream_id} is closed for writing")

    def _take(self, n: int) -> bytes:
        """Up to `n` buffered bytes (n < 0: up to all); a big first chunk is returned alone."""
        chunks = self._chunks
        assert chunks is not None  # only called with bytes buffered
        first = chunks[0]
        offset = self._offset
        if n < 0 or n > self._buffered:
            n = self._buffered
        head = len(first) - offset
        if n > head and head >= _COALESCE_BELOW:
            n = head  # a big first chunk alone, copied once, rather than joined with what follows
        if head >= n:  # served from the first chunk
            if offset == 0 and n == head:
                chunks.popleft()
                self._buffered -= n
                return first if type(first) is bytes else bytes(first)
            data = bytes(first[offset:offset + n])
            offset += n
            if offset == len(first):
                chunks.popleft()
                offset = 0
            self._offset = offset
            self._buffered -= n
            return data
        parts: list[bytes | memoryview] = []
        need = n
        while need:
            first = chunks[0]
            piece = first[offset:offset + need] if offset or len(first) > need else first
            parts.append(piece)
            need -= len(piece)
            offset += len(piece)
            if offset == len(first):
                chunks.popleft()
                offset = 0
        self._offset = offset
        self._buffered -= n
        return b"".join(parts)

    def _feed(self, data: bytes | memoryview) -> None:
        if self._chunks is None:
            self._chunks = deque()
        self._chunks.append(data)
        self._buffered += len(data)
        self._wake_reader()

    def _on_eof(self) -> None:
        self._eof = True
        self._wake_reader()

    def _on_connection_lost(self) -> None:
        if self._eof:  # the peer finished sending: what it sent stays readable
            self._write_closed = True
            self._wake_writer()
        else:
            self._on_reset()

    def _on_reset(self) -> None:
        self._reset = True
        self._wake_reader()
        self._wake_writer()

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter = self._window_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class MuxedConnection:
    """A yamux session over a secured connection, driven by asyncio tasks."""

    def __init__(
        self,
        conn: SecuredConnection,
        is_initiator: bool,
        on_stream: Callable[[YamuxStream], Awaitable[None]] | None,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL,
        keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT,
        max_window: int = MAX_WINDOW,
        max_frame_payload: int = DEFAULT_MAX_FRAME_PAYLOAD,
        window_growth_budget: int = DEFAULT_WINDOW_GROWTH_BUDGET,
        window_tuner: WindowTuner | None = None,
    ) -> None:
        self._conn = conn
        self._on_stream = on_stream
        self._keepalive_interval = keepalive_interval
        self._keepalive_timeout = keepalive_timeout
        self._session = YamuxSession(
            is_initiator, max_streams=max_streams, max_window=max_window,
            max_frame_payload=max_frame_payload, window_growth_budget=window_growth_budget,
            window_tuner=window_tuner)
        self._loop = asyncio.get_running_loop()
        self._streams: dict[int, YamuxStream] = {}
        self._pongs: dict[int, asyncio.Future[float]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._handler_tasks: set[asyncio.Task[None]] = set()
        self._sender_wake = asyncio.Event()
        self._sender_idle = asyncio.Event()
        self._sender_idle.set()
        self._outbound_room = asyncio.Event()  # set whenever the sender has taken the queue
        self._outbound_room.set()
        self._room_waiters: deque[asyncio.Future[None]] = deque()  # writers waiting for their turn
        self._batches_taken = 0  # data_to_send_parts() results the sender took...
        self._batches_written = 0  # ...and passed to conn.write, which returned
        self._written_waiter: asyncio.Future[None] | None = None  # writers waiting for a batch written
        self._last_received = self._loop.time()
        self._all_streams_done: asyncio.Event | None = None  # set up by close(drain_timeout=...)
        self._shut_down = False
        self.closed = False
        self.close_reason: str | None = None
        # set once either side sent GoAway: no new streams, the connection closes once its streams
        # finish (a retired relayed one); a long-lived stream's owner moves it elsewhere (docs/adr/0233)
        self.going_away = asyncio.Event()

    @property
    def num_streams(self) -> int:
        """Streams open in at least one direction."""
        return len(self._streams)

    @property
    def is_initiator(self) -> bool:
        return self._session.is_initiator

    @property
    def rtt(self) -> float | None:
        """Last measured ping round trip in seconds (None before the first pong)."""
        return self._session.rtt

    async def start(self) -> None:
        """Spawn the reader, sender and keepalive tasks, and measure the RTT once."""
        if self._tasks:
            return
        self._tasks.append(self._loop.create_task(self._read_loop()))
        self._tasks.append(self._loop.create_task(self._send_loop()))
        if self._keepalive_interval > 0:
            self._tasks.append(self._loop.create_task(self._keepalive_loop()))
        self._session.send_ping(self._loop.time())
        self._wake_sender()

    async def open_stream(self) -> YamuxStream:
        """Open an outbound stream. Raises MuxerClosedError after close or a GoAway."""
        if self.closed:
            raise MuxerClosedError(f"connection closed: {self.close_reason}")
        try:
            stream_id = self._session.open_stream()
        except YamuxSessionClosed as exc:
            raise MuxerClosedError(str(exc)) from exc
        stream = YamuxStream(self, stream_id)
        self._streams[stream_id] = stream
        self._wake_sender()
        return stream

    async def ping(self) -> float:
        """Send a ping and return the round trip in seconds."""
        if self.closed:
            raise MuxerClosedError(f"connection closed: {self.close_reason}")
        opaque = self._session.send_ping(self._loop.time())
        pong: asyncio.Future[float] = self._loop.create_future()
        self._pongs[opaque] = pong
        self._wake_sender()
        try:
            return await pong
        finally:
            self._pongs.pop(opaque, None)

    async def close(self, *, drain_timeout: float = 0.0) -> None:
        """Send GoAway, let open streams finish for up to `drain_timeout` seconds (no new ones are
        accepted meanwhile), then close the connection; streams still open are reset."""
        if self.closed:
            return
        self._session.go_away(GO_AWAY_NORMAL)
        self.going_away.set()
        self._wake_sender()
        if drain_timeout > 0 and self._streams and not self._shut_down:
            self._all_streams_done = asyncio.Event()
            try:
                await asyncio.wait_for(self._all_streams_done.wait(), drain_timeout)
            except TimeoutError:
                log.debug("yamux: %d streams still open after %.1fs", len(self._streams), drain_timeout)
        await self._shutdown("closed locally", flush=True)

    # ------------------------------------------------------------------ tasks

    async def _read_loop(self) -> None:
        reason = "connection closed by peer"
        session = self._session
        try:
            while True:
                data = await self._conn.read()
                if not data:
                    break
                now = self._loop.time()
                self._last_received = now
                self._dispatch(session.receive_data(data, now))
                if session.outbound_size:
                    self._wake_sender()
                    while session.outbound_size > READER_PAUSE_THRESHOLD:
                        await self._wait_outbound_taken()
        except YamuxProtocolError as exc:
            log.info("yamux: closing connection: protocol error: %s", exc)
            await self._shutdown(f"yamux protocol error: {exc}", flush=True)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport below failed (reset, decrypt error, ...)
            reason = f"connection read failed: {exc!r}"
            log.debug("yamux: %s", reason)
        await self._shutdown(reason)

    async def _send_loop(self) -> None:
        session = self._session
        try:
            while True:
                await self._sender_wake.wait()
                self._sender_wake.clear()
                while True:
                    parts = session.data_to_send_parts()
                    self._outbound_room.set()
                    self._pass_turn()
                    if not parts:
                        break
                    self._batches_taken += 1
                    await self._conn.write(parts)
                    self._batches_written += 1
                    self._wake_written_waiters()
                self._sender_idle.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._shutdown(f"connection write failed: {exc!r}")

    async def _keepalive_loop(self) -> None:
        interval = self._keepalive_interval
        while True:
            await asyncio.sleep(interval)
            if self._loop.time() - self._last_received < interval:
                continue  # the peer spoke recently: it is alive
            sent_at = self._loop.time()
            try:
                await asyncio.wait_for(self.ping(), self._keepalive_timeout)
            except TimeoutError:
                if self._last_received < sent_at:
                    await self._shutdown("keepalive timeout: peer silent")
                    return
            except MuxerClosedError:
                return

    # --------------------------------------------------------------- internals

    def _dispatch(self, events: list[YamuxEvent]) -> None:
        streams = self._streams
        for event in events:
            if type(event) is DataReceived:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream._feed(event.data)
            elif type(event) is SendWindowOpened:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream._wake_writer()
            elif type(event) is StreamOpened:
                self._accept_stream(event.stream_id)
            elif type(event) is StreamEnded:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream._on_eof()
                    self._forget_if_finished(stream)
            elif type(event) is StreamReset:
                stream = self._drop_stream(event.stream_id)
                if stream is not None:
                    stream._on_reset()
            elif type(event) is PongReceived:
                pong = self._pongs.pop(event.opaque, None)
                if pong is not None and not pong.done():
                    pong.set_result(event.rtt)
            elif type(event) is GoAwayReceived:
                log.debug("yamux: peer sent GoAway (code %d)", event.code)
                self.going_away.set()

    def _accept_stream(self, stream_id: int) -> None:
        if self._on_stream is None:
            self._session.reset_stream(stream_id)
            return
        stream = YamuxStream(self, stream_id)
        self._streams[stream_id] = stream
        task = self._loop.create_task(self._run_handler(stream))
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    async def _run_handler(self, stream: YamuxStream) -> None:
        if self._on_stream is None:  # _accept_stream resets streams when there is no handler
            return
        try:
            await self._on_stream(stream)
        except asyncio.CancelledError:
            raise
        except ConnectionError as exc:  # the stream or connection went away under the handler
            log.debug("yamux: stream handler on stream %d ended: %r", stream.stream_id, exc)
            stream.reset()
        except Exception:
            log.exception("yamux: stream handler failed on stream %d", stream.stream_id)
            stream.reset()

    def _acknowledge(self, stream_id: int, size: int) -> None:
        session = self._session
        if self.closed:
            return
        before = session.outbound_size
        session.acknowledge_received(stream_id, size, self._loop.time())
        if session.outbound_size != before:
            self._wake_sender()

    def _forget_if_finished(self, stream: YamuxStream) -> None:
        if not self._session.has_stream(stream.stream_id):
            self._drop_stream(stream.stream_id)

    def _drop_stream(self, stream_id: int) -> YamuxStream | None:
        stream = self._streams.pop(stream_id, None)
        if not self._streams and self._all_streams_done is not None:
            self._all_streams_done.set()
        return stream

    def _wake_sender(self) -> None:
        self._sender_idle.clear()
        self._sender_wake.set()

    async def _wait_outbound_taken(self) -> None:
        """Wait until the sender next takes the queued frames."""
        if self.closed:
            raise MuxerClosedError(f"connection closed: {self.close_reason}")
        self._outbound_room.clear()
        await self._outbound_room.wait()

    async def _wait_taken(self) -> None:
        """Wait until the connection has taken every frame queued so far (conn.write returned for
        the batch holding them), or the connection closed."""
        target = self._batches_taken + (1 if self._session.outbound_size else 0)
        while self._batches_written < target and not self._shut_down:
            if self._written_waiter is None:
                self._written_waiter = self._loop.create_future()
            await asyncio.shield(self._written_waiter)

    def _wake_written_waiters(self) -> None:
        waiter, self._written_waiter = self._written_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait_outbound_turn(self) -> None:
        """Wait, behind the writers already waiting, until there is room in the outbound queue.

        The woken writer fills the queue (up to OUTBOUND_HIGH_WATER) and queues up again at the
        back, so concurrent streams get the connection in turns of about OUTBOUND_HIGH_WATER bytes
        each; a writer that could re-check first after every wake-up would keep the connection
        to itself for as long as its send window lasts.
        """
        if self.closed:
            raise MuxerClosedError(f"connection closed: {self.close_reason}")
        turn = self._loop.create_future()
        self._room_waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._pass_turn()  # we were handed the turn but will not use it
            raise

    def _pass_turn(self) -> None:
        """Wake the first waiting writer if the outbound queue has room (or the connection closed)."""
        waiters = self._room_waiters
        while waiters and (self.closed or self._session.outbound_size < OUTBOUND_HIGH_WATER):
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                if not self.closed:
                    return

    async def _flush_briefly(self) -> None:
        """Best effort: let the sender write what is queued (e.g. our GoAway) before closing."""
        if not self._tasks:
            return
        if self._session.outbound_size:
            self._wake_sender()
        if self._sender_idle.is_set():
            return
        try:
            await asyncio.wait_for(self._sender_idle.wait(), _CLOSE_FLUSH_TIMEOUT)
        except TimeoutError:
            log.debug("yamux: queued frames not flushed within %.1fs", _CLOSE_FLUSH_TIMEOUT)

    async def _shutdown(self, reason: str, *, flush: bool = False) -> None:
        """Reset every stream, fail pending pings, optionally flush, stop the tasks, close conn."""
        if self._shut_down:
            return
        self._shut_down = True
        self.closed = True
        if self.close_reason is None:
            self.close_reason = reason
        for stream in self._streams.values():
            stream._on_connection_lost()
        self._streams.clear()
        if self._all_streams_done is not None:
            self._all_streams_done.set()
        for pong in self._pongs.values():
            if not pong.done():
                pong.set_exception(MuxerClosedError(f"connection closed: {reason}"))
        self._pongs.clear()
        self._outbound_room.set()
        self._pass_turn()  # closed: wakes every waiting writer, which then sees the reset
        if flush:
            await self._flush_briefly()
        self._session.close()  # gives the streams' receive windows back to a shared tuner
        self._sender_idle.set()
        self._wake_written_waiters()  # their frames will not be sent now: the streams are reset
        current = asyncio.current_task()
        for task in [*self._tasks, *self._handler_tasks]:
            if task is not current:
                task.cancel()
        try:
            await self._conn.close()
        except Exception as exc:
            log.debug("yamux: closing the connection failed: %r", exc)



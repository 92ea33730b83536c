"""One QUIC bidirectional stream with the yamux stream's API (read, readexactly, write, close, reset).

A libp2p stream over QUIC is a QUIC bidirectional stream (libp2p/specs quic/README.md): no muxer
of our own, multistream-select runs on it as on a yamux stream. ``QuicStream`` buffers the bytes
its session delivers and offers the calls ``HostStream`` and every protocol handler already use;
``write`` waits while the stream's unacknowledged send buffer is over ``SEND_HIGH_WATER`` (aioquic
itself buffers without bound); what ``read`` takes moves the receive window on (the session's
``_consumed``), so a peer can make us buffer only a window's worth. Reads after a reset or a lost
connection raise like yamux's.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .muxer import MuxerClosedError, StreamResetError

if TYPE_CHECKING:
    from .quic_transport import QuicSession

SEND_HIGH_WATER = 1 << 20   # unacknowledged bytes per stream before write() waits


class QuicStream:
    def __init__(self, session: QuicSession, stream_id: int) -> None:
        self._session = session
        self.stream_id = stream_id
        self._buffer = bytearray()
        self._eof = False
        self._error: ConnectionError | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self._write_closed = False

    # ---- session side
    def _feed(self, data: bytes, end: bool) -> None:
        self._buffer += data
        self._eof = self._eof or end
        self._wake()

    def _fail(self, error: ConnectionError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _discard(self) -> int:
        """Drop unread bytes (the stream is gone); return how many."""
        n = len(self._buffer)
        self._buffer.clear()
        return n

    def _wake(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def finished(self) -> bool:
        return self._error is not None or (self._eof and self._write_closed and not self._buffer)

    async def _wait_readable(self) -> None:
        if self._read_waiter is not None:
            raise RuntimeError(f"quic stream {self.stream_id}: another task is already reading")
        self._read_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._read_waiter
        finally:
            self._read_waiter = None

    # ---- the yamux-stream API
    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (n < 0: all buffered), waiting for at least one; b"" at EOF."""
        if n == 0:
            return b""
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._eof:
                self._session._stream_progress(self)
                return b""
            await self._wait_readable()
        if n < 0 or n >= len(self._buffer):
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            data = bytes(self._buffer[:n])
            del self._buffer[:n]
        self._session._consumed(self.stream_id, len(data))
        self._session._stream_progress(self)
        return data

    async def readexactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if self._error is not None:
                raise self._error
            if self._eof:
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(partial, n)
            await self._wait_readable()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        self._session._consumed(self.stream_id, n)
        self._session._stream_progress(self)
        return data

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        if self._write_closed:
            raise ConnectionResetError(f"quic stream {self.stream_id} is closed for writing")
        if data:
            self._session._send(self.stream_id, bytes(data), end=False)
            await self._session._wait_send_room(self, SEND_HIGH_WATER)

    async def close(self) -> None:
        """Half-close: send FIN; reading continues until the peer's FIN."""
        if self._write_closed or self._error is not None:
            return
        self._write_closed = True
        if not self._session.closed:
            self._session._send(self.stream_id, b"", end=True)
        self._session._stream_progress(self)

    def reset(self) -> None:
        """Abort both directions (RESET_STREAM and STOP_SENDING); pending reads and writes raise."""
        if self._error is not None:
            return
        self._session._reset(self.stream_id)
        self._fail(StreamResetError(f"quic stream {self.stream_id} was reset"))
        self._session._stream_progress(self)

    def _connection_lost(self) -> None:
        self._fail(MuxerClosedError("quic connection closed"))

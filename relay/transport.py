"""Relayed connections: noise + yamux over a circuit stream, registered with the Host like TCP ones.

A circuit is a byte stream (a yamux stream to the relay, spliced by the relay to the other peer).
``StreamPipe`` presents that stream with the interface ``secure_connection`` and the Host expect of
a ``TcpConnection`` (chunk reads with unread, buffered write + drain, close/abort, lost-callbacks),
and counts the bytes it carries both ways for relay receipts. ``upgrade_circuit`` runs the same
upgrade as a TCP dial (multistream ``/noise``, noise XX, multistream ``/yamux/1.0.0``) through the
public ``Host.upgrade`` and so registers the result with the Host: ``host.open_stream(peer, ...)``
works over the relayed connection. To let the Host itself dial relayed addresses (``connect``,
``open_stream`` from the peer book, ``open_bulk_connection``), register the relay client's dial:
``host.register_circuit_dialer(lambda maddr, bulk: client.dial([str(maddr)], bulk=bulk))``.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from node.p2p.host import Connection, Host

from .messages import Limit

CLOSE_GRACE_SECONDS = 5.0
_closing: set[asyncio.Task] = set()  # strong references: a closing pipe may be dropped by its owner


class StreamPipe:
    """A relayed stream shaped like ``TcpConnection``, with byte counters for accounting."""

    def __init__(self, stream, relay_peer: str, session: bytes | None = None, leftover: bytes = b"") -> None:
        """``leftover``: circuit bytes that arrived together with the relay's last message."""
        self._stream = stream
        self.relay_peer = relay_peer
        self.session = session
        self.bytes_sent = 0
        self.bytes_received = len(leftover)
        self._pushback: deque[bytes] = deque([leftover] if leftover else [])
        self._pending: list = []  # bytes-like, not copied
        self._write_lock = asyncio.Lock()
        self._closed_exc: BaseException | None = None
        self._eof = False
        self._closer: asyncio.Task | None = None
        self.connection_lost_callbacks: list = []
        self.peername = None  # no IP endpoint: identify then advertises no observed address
        self.sockname = None

    @property
    def bytes_total(self) -> int:
        return self.bytes_sent + self.bytes_received

    @property
    def is_closed(self) -> bool:
        return self._closed_exc is not None

    def _lost(self, exc: BaseException) -> None:
        if self._closed_exc is not None:
            return
        self._closed_exc = exc
        callbacks, self.connection_lost_callbacks = self.connection_lost_callbacks, []
        for callback in callbacks:
            callback()

    async def read(self) -> bytes:
        """The next received chunk, or b"" at EOF (or when the circuit is gone)."""
        if self._pushback:
            return self._pushback.popleft()
        if self._eof:
            return b""
        try:
            data = await self._stream.read()
        except ConnectionError as exc:
            data = b""
            self._lost(exc)
        if not data:
            self._eof = True
            self._lost(ConnectionResetError("relayed stream ended"))
            return b""
        self.bytes_received += len(data)
        return data

    async def read_chunks(self, max_bytes: int = 0) -> list[bytes]:
        data = await self.read()
        return [data] if data else []

    def unread(self, data: bytes) -> None:
        if data:
            self._pushback.appendleft(data)

    def write(self, data) -> None:
        """Queue ``data`` for ``drain``; it is not copied, so it must not change afterwards (the
        secure layer hands over freshly encrypted frames)."""
        if self._closed_exc is not None:
            raise ConnectionResetError("relayed connection closed")
        self._pending.append(data)

    async def drain(self) -> None:
        async with self._write_lock:
            while self._pending:
                if self._closed_exc is not None:
                    raise ConnectionResetError("relayed connection closed")
                data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
                self._pending.clear()
                try:
                    await self._stream.write(data)
                except (ConnectionError, RuntimeError) as exc:
                    self._lost(exc)
                    raise ConnectionResetError(f"relayed stream failed: {exc}") from exc
                self.bytes_sent += len(data)

    def close(self) -> None:
        """Half-close (FIN after everything written), then reset after a grace period."""
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self._close_gracefully())
            _closing.add(self._closer)
            self._closer.add_done_callback(_closing.discard)
        self._lost(ConnectionResetError("relayed connection closed"))

    async def _close_gracefully(self) -> None:
        with contextlib.suppress(Exception):
            async with self._write_lock:
                await self._stream.close()
            await asyncio.sleep(CLOSE_GRACE_SECONDS)
        self._stream.reset()

    def abort(self) -> None:
        self._stream.reset()
        self._lost(ConnectionResetError("relayed connection aborted"))


async def upgrade_circuit(host: Host, pipe: StreamPipe, is_initiator: bool, expected_peer: str | None,
                          bulk: bool = False, limit: Limit | None = None) -> Connection:
    """Secure and multiplex a circuit and register it with ``host``; returns the Connection.

    The dialing side (``is_initiator``) knows whom it expects; the accepting side learns the peer
    from the noise handshake. On failure the pipe is aborted and ProtocolError (HandshakeTimeout
    included), OSError or DialError (connection limits) propagates.
    """
    return await host.upgrade(pipe, is_initiator=is_initiator, expected_peer=expected_peer, bulk=bulk,
                              limit=limit)

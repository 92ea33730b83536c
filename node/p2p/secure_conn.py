"""Asyncio driver for ``/noise`` over TCP: a buffered TCP protocol and the SecureConn on top.

``TcpConnection`` is an ``asyncio.Protocol`` that queues received chunks (pausing the socket
when too much is buffered) and offers ``read``/``write``/``drain``; it carries the cleartext
multistream negotiation and the noise handshake. ``SecureConn`` runs the sans-I/O
``NoiseTransport`` over it: ``read`` decrypts every complete frame received so far in one go
(bulk reads come back as a memoryview, not copied again), ``write`` encrypts a buffer or a list
of buffers (the muxer's headers and payloads, never joined) into one buffer of frames and waits
for the socket to drain (back-pressure). The yamux driver consumes SecureConn.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from node.identity import Identity

from .errors import HandshakeTimeout, ProtocolError
from .noise import BytesLike, NoiseHandshake, NoiseTransport

READ_HIGH_WATER = 1 << 20
READ_BATCH_BYTES = 1 << 20


class BytePipe(Protocol):
    """An ordered byte pipe shaped like ``TcpConnection`` (a relayed circuit is another): what the
    multistream negotiation, the noise handshake and ``SecureConn`` run over."""

    connection_lost_callbacks: list[Callable[[], None]]

    async def read(self) -> bytes: ...

    async def read_chunks(self, max_bytes: int = ...) -> list[bytes]: ...

    def unread(self, data: bytes) -> None: ...

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    @property
    def is_closed(self) -> bool: ...

    @property
    def peername(self) -> tuple[str, int] | None: ...

    @property
    def sockname(self) -> tuple[str, int] | None: ...


class TcpConnection(asyncio.Protocol):
    """A TCP socket as a queue of received chunks with flow control both ways."""

    def __init__(self, high_water: int = READ_HIGH_WATER) -> None:
        self.transport: asyncio.Transport | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._high_water = high_water
        self._paused_reading = False
        self._eof = False
        self._closed_exc: BaseException | None = None
        self._data_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self.connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.connection_lost_callbacks: list[Callable[[], None]] = []  # called once, with no arguments

    # asyncio.Protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.connected.done():
            self.connected.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > self._high_water and not self._paused_reading and self.transport is not None:
            self._paused_reading = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._closed_exc = exc or ConnectionResetError("connection closed")
        self._wake_reader()
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("connection lost while writing"))
        callbacks, self.connection_lost_callbacks = self.connection_lost_callbacks, []
        for callback in callbacks:
            callback()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_reader(self) -> None:
        waiter = self._data_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # API
    @property
    def peername(self) -> tuple[str, int] | None:
        return self.transport.get_extra_info("peername") if self.transport else None

    @property
    def sockname(self) -> tuple[str, int] | None:
        return self.transport.get_extra_info("sockname") if self.transport else None

    async def _wait_data(self) -> bool:
        while not self._chunks:
            if self._eof:
                return False
            self._data_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._data_waiter
            finally:
                self._data_waiter = None
        return True

    def _consumed(self, size: int) -> None:
        self._buffered -= size
        if self._paused_reading and self._buffered <= self._high_water // 2 and self.transport:
            self._paused_reading = False
            self.transport.resume_reading()

    async def read(self) -> bytes:
        """The next received chunk, or b"" at EOF."""
        if not await self._wait_data():
            return b""
        data = self._chunks.popleft()
        self._consumed(len(data))
        return data

    async def read_chunks(self, max_bytes: int = READ_BATCH_BYTES) -> list[bytes]:
        """Received chunks (at least one, about ``max_bytes`` in all), or [] at EOF."""
        if not await self._wait_data():
            return []
        chunks = self._chunks
        if len(chunks) == 1:
            batch = [chunks.popleft()]
            size = len(batch[0])
        else:
            batch = []
            size = 0
            while chunks and size < max_bytes:
                part = chunks.popleft()
                batch.append(part)
                size += len(part)
        self._consumed(size)
        return batch

    def unread(self, data: bytes) -> None:
        """Put bytes back in front of the receive queue (negotiation leftovers)."""
        if data:
            self._chunks.appendleft(data)
            self._buffered += len(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection closed")
        self.transport.write(data)

    async def drain(self) -> None:
        if self._closed_exc is not None:
            raise ConnectionResetError("connection closed")
        if not self._write_paused:
            return
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    @property
    def is_closed(self) -> bool:
        return self._closed_exc is not None


class SecureConn:
    """A noise-encrypted, authenticated connection to ``remote_peer``."""

    def __init__(self, tcp: BytePipe, transport: NoiseTransport, local_peer: str, remote_peer: str,
                 is_initiator: bool) -> None:
        self._tcp = tcp
        self._noise = transport
        self.local_peer = local_peer
        self.remote_peer = remote_peer
        self.is_initiator = is_initiator
        self._pushback: bytes = b""

    @property
    def tcp(self) -> BytePipe:
        return self._tcp

    async def read(self) -> bytes | memoryview:
        """Next decrypted plaintext chunk (a read-only memoryview when large); b"" at EOF.
        Raises NoiseError on a bad frame."""
        if self._pushback:
            data, self._pushback = self._pushback, b""
            return data
        while True:
            chunks = await self._tcp.read_chunks()
            if not chunks:
                return b""
            plain = self._noise.receive_chunks(chunks)
            if plain:
                return plain

    def unread(self, data: bytes) -> None:
        """Return plaintext to the front of the stream (bytes a negotiation read too far)."""
        self._pushback = bytes(data) + self._pushback

    async def write(self, data: BytesLike | Sequence[BytesLike]) -> None:
        """Encrypt and send a bytes-like object or a list of them (in order, without joining
        them first); waits while the socket's buffer is full. The buffers must not change until
        this returns."""
        frames = self._noise.encrypt(data)
        if not frames:
            return
        self._tcp.write(frames)
        await self._tcp.drain()

    async def close(self) -> None:
        self._tcp.close()

    @property
    def is_closed(self) -> bool:
        return self._tcp.is_closed


async def _run_handshake(tcp: BytePipe, handshake: NoiseHandshake) -> None:
    while True:
        out = handshake.data_to_send()
        if out:
            tcp.write(out)
            await tcp.drain()
        if handshake.complete:
            return
        data = await tcp.read()
        if not data:
            raise ProtocolError("connection closed during the noise handshake")
        handshake.receive_data(data)


async def secure_connection(tcp: BytePipe, identity: Identity, is_initiator: bool,
                            expected_peer: str | None = None,
                            static_keypair: tuple[bytes, bytes] | None = None,
                            timeout: float = 10.0) -> SecureConn:
    """Run the noise XX handshake on ``tcp`` and return the SecureConn.

    Raises NoiseError (bad handshake, PeerIdMismatch), ProtocolError (EOF) or HandshakeTimeout.
    """
    handshake = NoiseHandshake(identity, is_initiator, expected_peer, static_keypair)
    try:
        async with asyncio.timeout(timeout):
            await _run_handshake(tcp, handshake)
    except TimeoutError as exc:
        raise HandshakeTimeout(f"noise handshake took longer than {timeout} s") from exc
    transport, remote_peer = handshake.transport()
    conn = SecureConn(tcp, transport, identity.peer_id, remote_peer, is_initiator)
    if handshake.unused:
        tcp.unread(handshake.unused)
    return conn

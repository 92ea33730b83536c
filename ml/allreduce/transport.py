"""The small transport interface all-reduce runs on, and its adapter over plain asyncio TCP.

All-reduce needs only: open a stream to a peer for a protocol, register a handler for incoming
streams of a protocol (told the authenticated remote peer id), and streams with `read`,
`readexactly`, `write` (with back-pressure), `close` and `reset`. The node's Host provides this
over libp2p-compatible connections; `TcpTransport` provides it over loopback/LAN TCP for tests and
benchmarks. Its hello (peer id + protocol) is NOT authenticated: use it only among trusted
processes (tests, the benchmark), never on an open network.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Awaitable, Callable, Protocol

import numpy as np

HELLO_TIMEOUT_S = 10.0
READ_BUFFER_BYTES = 4 << 20  # received but unread bytes beyond which reading pauses
DIRECT_READ_BYTES = 64 << 10  # reads at least this large are received in place, not copied
SCRATCH_BYTES = 256 << 10     # receive buffer for smaller reads
MAX_HELLO_FIELD = 255


class Stream(Protocol):
    """A reliable ordered byte stream to one remote peer."""

    async def read(self, n: int) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...

    def reset(self) -> None: ...


StreamHandler = Callable[[Stream, str], Awaitable[None]]


class Transport(Protocol):
    """Opens streams to peers by id and dispatches incoming streams by protocol."""

    async def open_stream(self, peer_id: str, protocol: str) -> Stream: ...

    def set_handler(self, protocol: str, handler: StreamHandler) -> None: ...


class TransportError(ConnectionError):
    """A stream could not be opened or an incoming stream had a bad hello."""


class _StreamProtocol(asyncio.BufferedProtocol):
    """Receives into buffers it hands the event loop: large reads go straight into the buffer
    `readexactly` returns (no StreamReader copies), small ones through a scratch buffer."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self._scratch = bytearray(SCRATCH_BYTES)
        self._buffered = bytearray()        # received, not yet read
        self._target: memoryview | None = None  # a large readexactly being filled in place
        self._filled = 0
        self._eof = False
        self._error: BaseException | None = None
        self._read_paused = False
        self._waiter: asyncio.Future | None = None
        self._write_waiter: asyncio.Future | None = None
        self._write_paused = False
        self.made = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()

    # -- event loop callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.made.set_result(None)

    def get_buffer(self, sizehint: int):
        if self._target is not None:
            return self._target[self._filled:]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._filled += nbytes
            if self._filled < len(self._target):
                return
        else:
            self._buffered += memoryview(self._scratch)[:nbytes]
            if len(self._buffered) > READ_BUFFER_BYTES and not self._read_paused:
                self._read_paused = True
                self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc) -> None:
        self._eof = True
        self._error = exc
        self._wake()
        self.resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._write_waiter is not None and not self._write_waiter.done():
            self._write_waiter.set_result(None)

    # -- reading and writing, for TcpStream
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        if self._error is not None:
            raise ConnectionResetError(f"connection lost: {self._error}")
        if self._read_paused and len(self._buffered) <= READ_BUFFER_BYTES:
            self._read_paused = False
            self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _take(self, n: int) -> bytes:
        data = bytes(memoryview(self._buffered)[:n])
        del self._buffered[:n]
        return data

    async def read(self, n: int) -> bytes:
        while not self._buffered and not self._eof:
            await self._wait()
        if not self._buffered and self._error is not None:
            raise ConnectionResetError(f"connection lost: {self._error}")
        return self._take(min(n, len(self._buffered)))

    async def readexactly(self, n: int) -> bytes | memoryview:
        if n < DIRECT_READ_BYTES or len(self._buffered) >= n:
            while len(self._buffered) < n:
                if self._eof:
                    await self._fail_incomplete(self._take(len(self._buffered)), n)
                await self._wait()
            return self._take(n)
        target = memoryview(np.empty(n, np.uint8))  # filled in place by the event loop; not zeroed first
        have = len(self._buffered)
        target[:have] = self._buffered
        self._buffered.clear()
        self._target, self._filled = target, have
        try:
            while self._filled < n:
                if self._eof:
                    await self._fail_incomplete(bytes(target[:self._filled]), n)
                await self._wait()
        finally:
            self._target = None
        return target

    async def _fail_incomplete(self, partial: bytes, n: int) -> None:
        if self._error is not None:
            raise ConnectionResetError(f"connection lost: {self._error}")
        raise asyncio.IncompleteReadError(partial, n)

    async def drain(self) -> None:
        if self._error is not None or (self.transport is not None and self.transport.is_closing()):
            raise ConnectionResetError("connection is closing")
        while self._write_paused:
            self._write_waiter = asyncio.get_running_loop().create_future()
            await self._write_waiter


class TcpStream:
    """`Stream` over an asyncio TCP connection (`_StreamProtocol`)."""

    def __init__(self, protocol: _StreamProtocol):
        self._protocol = protocol
        self._transport = protocol.transport
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def read(self, n: int) -> bytes:
        return await self._protocol.read(n)

    async def readexactly(self, n: int) -> bytes | memoryview:
        """n bytes; a large read comes back as a view of the buffer it was received into."""
        return await self._protocol.readexactly(n)

    async def write(self, data: bytes | memoryview) -> None:
        await self._protocol.drain()
        self._transport.write(data)
        await self._protocol.drain()

    async def close(self) -> None:
        self._transport.close()
        with contextlib.suppress(Exception):
            await self._protocol.closed

    def reset(self) -> None:
        self._transport.abort()


def _pack_hello(peer_id: str, protocol: str) -> bytes:
    fields = [peer_id.encode(), protocol.encode()]
    if any(len(f) > MAX_HELLO_FIELD or not f for f in fields):
        raise TransportError("peer id and protocol must be 1..255 bytes")
    return b"".join(struct.pack(">B", len(f)) + f for f in fields)


async def _read_hello(stream: TcpStream) -> tuple[str, str]:
    fields = []
    for _ in range(2):
        (length,) = struct.unpack(">B", await stream.readexactly(1))
        if length == 0:
            raise TransportError("empty hello field")
        fields.append((await stream.readexactly(length)).decode("utf-8"))
    return fields[0], fields[1]


class TcpTransport:
    """`Transport` over TCP: a listening server plus an address book peer id -> (host, port)."""

    def __init__(self, my_id: str, host: str = "127.0.0.1", port: int = 0,
                 addresses: dict[str, tuple[str, int]] | None = None):
        self.my_id = my_id
        self._host = host
        self._port = port
        self.addresses: dict[str, tuple[str, int]] = dict(addresses or {})
        self._handlers: dict[str, StreamHandler] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._streams: set[TcpStream] = set()

    @property
    def listen_address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("transport not started")
        return self._server.sockets[0].getsockname()[:2]

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, self._host, self._port)
        return self.listen_address

    def _accept(self) -> _StreamProtocol:
        protocol = _StreamProtocol()
        task = asyncio.get_running_loop().create_task(self._on_connection(protocol))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return protocol

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for stream in list(self._streams):
            stream.reset()  # handlers see the stream end and return
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2.0)

    def set_handler(self, protocol: str, handler: StreamHandler) -> None:
        self._handlers[protocol] = handler

    async def open_stream(self, peer_id: str, protocol: str) -> TcpStream:
        address = self.addresses.get(peer_id)
        if address is None:
            raise TransportError(f"no address for peer {peer_id}")
        try:
            _, connection = await asyncio.get_running_loop().create_connection(_StreamProtocol, *address)
        except OSError as exc:
            raise TransportError(f"cannot connect to {peer_id} at {address}: {exc}") from exc
        stream = TcpStream(connection)
        await stream.write(_pack_hello(self.my_id, protocol))
        return stream

    async def _on_connection(self, stream_protocol: _StreamProtocol) -> None:
        await stream_protocol.made
        stream = TcpStream(stream_protocol)
        self._streams.add(stream)
        try:
            try:
                remote, protocol = await asyncio.wait_for(_read_hello(stream), HELLO_TIMEOUT_S)
            except (asyncio.IncompleteReadError, UnicodeDecodeError, TransportError, TimeoutError, ConnectionError):
                stream.reset()
                return
            handler = self._handlers.get(protocol)
            if handler is None:
                stream.reset()
                return
            await handler(stream, remote)
        finally:
            self._streams.discard(stream)
            await stream.close()

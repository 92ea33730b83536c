"""The small transport interface all-reduce runs on, and its adapter over plain asyncio TCP.

All-reduce needs only: open a stream to a peer for a protocol, register a handler for incoming
streams of a protocol (told the authenticated remote peer id), and streams with `read`,
`readexactly`, `write` (with back-pressure), `close` and `reset`. The node's Host provides this
over libp2p-compatible connections; `TcpTransport` provides it over loopback/LAN TCP for tests and
benchmarks. Its hello (peer id + protocol) is NOT authenticated: use it only among trusted
processes (tests, the benchmark), never on an open network.

`TcpStream` receives large reads in place: the event loop writes the socket's bytes straight
into the buffer `readexactly` returns (no StreamReader copies, docs/adr/0095). Its semantics are
StreamReader/StreamWriter's: a received EOF keeps the connection half-open (this side can still
write), a clean end of stream is `IncompleteReadError` (with the partial bytes), a lost connection
is `ConnectionResetError`, and unread bytes beyond `READ_BUFFER_BYTES` pause reading.

A stream may also have `going_away`: an `asyncio.Event` set once the connection under it takes no
new streams and will close when its streams finish (the Host's streams: a relayed connection retired
after a hole punch); `links.py` then moves its long-lived stream to a new one (docs/adr/0233).
`TcpStream` has none: its connection is the stream.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import numpy as np

HELLO_TIMEOUT_S = 10.0
READ_BUFFER_BYTES = 4 << 20   # received but unread bytes beyond which reading pauses
DIRECT_READ_BYTES = 128 << 10  # reads this large land in place (and come back as memoryviews);
#                                above wire.MAX_META_BYTES so JSON meta always comes back as bytes
SCRATCH_BYTES = 256 << 10      # receive buffer for everything not received in place
MAX_HELLO_FIELD = 255
UNSENT_LOWAT_BYTES = 64 << 10  # TCP_NOTSENT_LOWAT: writers wait while more than this is unsent


def set_unsent_lowat(sock: socket.socket) -> None:
    """Keep at most ~64 KiB of not-yet-sent bytes in the kernel (in-flight bytes are not limited):
    a write then returns about when its frame is on the wire, so the uplink's turn-taking
    (uplink.py) decides the order frames leave in. Best effort: a no-op where unsupported."""
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_LOWAT_BYTES)


class Stream(Protocol):
    """A reliable ordered byte stream to one remote peer."""

    async def read(self, n: int) -> bytes: ...

    async def readexactly(self, n: int) -> bytes | memoryview: ...

    async def write(self, data: bytes | memoryview) -> None: ...

    async def close(self) -> None: ...

    def reset(self) -> None: ...


StreamHandler = Callable[[Stream, str], Awaitable[None]]


def going_away(stream: Any) -> asyncio.Event | None:
    """The `going_away` event of a stream (or of the Host connection under it), if its transport has one
    (see the module docstring)."""
    event = getattr(stream, "going_away", None)
    return event if isinstance(event, asyncio.Event) else None


def is_going_away(stream: Any) -> bool:
    """Whether the connection under ``stream`` (or that connection itself) takes no new streams now."""
    event = going_away(stream)
    return event is not None and event.is_set()


class Transport(Protocol):
    """Opens streams to peers by id and dispatches incoming streams by protocol."""

    async def open_stream(self, peer_id: str, protocol: str) -> Stream: ...

    def set_handler(self, protocol: str, handler: StreamHandler) -> None: ...


class TransportError(ConnectionError):
    """A stream could not be opened or an incoming stream had a bad hello."""


class PeerUnreachable(TransportError):
    """No connection to the peer could be made (a dial failed): it is gone or cut off, not only busy or
    not serving the protocol yet. Links back off from such a peer (links.py)."""


class _InPlaceProtocol(asyncio.BufferedProtocol):
    """One TCP connection's receive buffer and write back-pressure (the event-loop side of a
    `TcpStream`). A large `readexactly` hands the loop its own result buffer (`_target`); every
    other byte goes through a scratch buffer into `_unread`."""

    def __init__(self, on_connected: Callable[[_InPlaceProtocol], None] | None = None):
        loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._on_connected = on_connected
        self._scratch = bytearray(SCRATCH_BYTES)
        self._unread = bytearray()
        self._target: memoryview | None = None  # the large read being filled in place
        self._filled = 0
        self._eof = False                        # no more bytes will arrive
        self._lost: BaseException | None = None  # why the connection was lost (None: not, or cleanly)
        self._connection_lost = False
        self._reading_paused = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._drain_waiters: deque[asyncio.Future[None]] = deque()
        self.closed = loop.create_future()

    # -- event loop callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # a TCP connection's (uvloop's is not a subclass)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_unsent_lowat(sock)
        if self._on_connected is not None:
            self._on_connected(self)

    def _connected(self) -> asyncio.Transport:
        """The connection's transport (set by connection_made before any other callback)."""
        assert self.transport is not None
        return self.transport

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        # never an empty buffer (the loop would kill the connection): once the target is full,
        # bytes that arrive before its reader resumes go to scratch like any others
        if self._target is not None and self._filled < len(self._target):
            return self._target[self._filled:]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None and self._filled < len(self._target):
            self._filled += nbytes
            if self._filled == len(self._target):
                self._wake_reader()
            return
        self._unread += memoryview(self._scratch)[:nbytes]
        if len(self._unread) > READ_BUFFER_BYTES and not self._reading_paused:
            self._reading_paused = True
            self._connected().pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return True  # stay half-open: this side may still write (StreamReaderProtocol does the same)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._eof = True
        self._connection_lost = True
        self._lost = exc
        self._wake_reader()
        self._writing_paused = False
        self._wake_drainers()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_drainers()

    # -- reading --------------------------------------------------------------------------

    def _wake_reader(self) -> None:
        if self._read_waiter is not None and not self._read_waiter.done():
            self._read_waiter.set_result(None)

    def _raise_if_lost(self) -> None:
        if self._lost is not None:
            raise ConnectionResetError(f"connection lost: {self._lost!r}") from self._lost

    def _resume_reading(self) -> None:
        self._reading_paused = False
        if not self._connection_lost:
            self._connected().resume_reading()

    def _resume_reading_if_drained(self) -> None:
        if self._reading_paused and len(self._unread) <= READ_BUFFER_BYTES // 2:
            self._resume_reading()

    async def _wait_for_bytes(self) -> None:
        """Until more bytes, EOF or loss; reading is resumed first (we are out of unread bytes)."""
        if self._read_waiter is not None:
            raise RuntimeError("another coroutine is already reading this stream")
        if self._reading_paused:
            self._resume_reading()
        self._read_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._read_waiter
        finally:
            self._read_waiter = None

    def _take(self, n: int) -> bytes:
        data = bytes(memoryview(self._unread)[:n])
        del self._unread[:n]
        self._resume_reading_if_drained()
        return data

    async def read(self, n: int) -> bytes:
        """Up to n bytes (n < 0: everything until EOF); b"" at EOF."""
        self._raise_if_lost()
        if n == 0:
            return b""
        while not self._eof and (n < 0 or not self._unread):
            await self._wait_for_bytes()
            self._raise_if_lost()
        return self._take(len(self._unread) if n < 0 else min(n, len(self._unread)))

    async def readexactly(self, n: int) -> bytes | memoryview:
        """Exactly n bytes: a memoryview over a fresh buffer if n >= DIRECT_READ_BYTES, else bytes.
        IncompleteReadError (with what arrived) if the stream ends first."""
        if n < 0:
            raise ValueError("readexactly size can not be less than zero")
        self._raise_if_lost()
        if n < DIRECT_READ_BYTES:
            while len(self._unread) < n:
                if self._eof:
                    raise asyncio.IncompleteReadError(self._take(len(self._unread)), n)
                await self._wait_for_bytes()
                self._raise_if_lost()
            return self._take(n)
        target = memoryview(np.empty(n, np.uint8).data)  # every byte is overwritten: no need to zero it
        have = min(n, len(self._unread))  # bytes that arrived before this read
        target[:have] = memoryview(self._unread)[:have]
        del self._unread[:have]
        self._resume_reading_if_drained()
        if have == n:
            return target
        self._target, self._filled = target, have  # _unread is empty: the rest lands in place
        try:
            while self._filled < n:
                if self._eof:
                    raise asyncio.IncompleteReadError(bytes(target[:self._filled]), n)
                await self._wait_for_bytes()
                self._raise_if_lost()
        except asyncio.CancelledError:  # like StreamReader's, a cancelled read consumes nothing
            self._unread[0:0] = target[:self._filled]
            raise
        finally:
            self._target = None
        return target

    # -- writing --------------------------------------------------------------------------

    async def drain(self) -> None:
        """Until the transport's write buffer is below its high-water mark; ConnectionResetError
        if the connection was lost (the bytes may not have arrived)."""
        while self._writing_paused and not self._connection_lost:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._drain_waiters.remove(waiter)
        if self._connection_lost:
            raise ConnectionResetError(f"connection lost: {self._lost!r}")

    def _wake_drainers(self) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)


class TcpStream:
    """`Stream` over one asyncio TCP connection, receiving large reads in place."""

    def __init__(self, protocol: _InPlaceProtocol):
        self._protocol = protocol
        self._transport = protocol._connected()

    async def read(self, n: int) -> bytes:
        return await self._protocol.read(n)

    async def readexactly(self, n: int) -> bytes | memoryview:
        """n bytes; a read of at least DIRECT_READ_BYTES is the memoryview it was received into."""
        return await self._protocol.readexactly(n)

    async def write(self, data: bytes | memoryview) -> None:
        """Queue data and wait while the send buffer is full; ConnectionResetError once the
        connection is lost, ConnectionError after our own close."""
        if self._transport.is_closing():
            await self._protocol.drain()  # raises if the connection is gone
            raise ConnectionError("stream is closed")
        self._transport.write(data)
        await self._protocol.drain()

    def write_eof(self) -> None:
        """Half-close: the peer reads EOF after the bytes written so far; we can still read."""
        self._transport.write_eof()

    async def close(self) -> None:
        """Close after the buffered bytes are sent, and wait until the connection is gone."""
        self._transport.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(self._protocol.closed)

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
        fields.append(bytes(await stream.readexactly(length)).decode("utf-8"))
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
        self._tasks: set[asyncio.Task[None]] = set()
        self._streams: set[TcpStream] = set()

    @property
    def listen_address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("transport not started")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _InPlaceProtocol(on_connected=self._on_connection), self._host, self._port)
        return self.listen_address

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
            _, connection = await asyncio.get_running_loop().create_connection(_InPlaceProtocol, *address)
        except OSError as exc:
            raise PeerUnreachable(f"cannot connect to {peer_id} at {address}: {exc}") from exc
        stream = TcpStream(connection)
        await stream.write(_pack_hello(self.my_id, protocol))
        return stream

    def _on_connection(self, connection: _InPlaceProtocol) -> None:
        stream = TcpStream(connection)
        self._streams.add(stream)
        task = asyncio.get_running_loop().create_task(self._serve(stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, stream: TcpStream) -> None:
        try:
            try:
                remote, protocol = await asyncio.wait_for(_read_hello(stream), HELLO_TIMEOUT_S)
            except (asyncio.IncompleteReadError, UnicodeDecodeError, TransportError, TimeoutError,
                    ConnectionError):
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

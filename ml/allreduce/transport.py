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

HELLO_TIMEOUT_S = 10.0
READ_BUFFER_BYTES = 4 << 20  # StreamReader limit: fewer pause/resume cycles for 1 MB frames
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


class TcpStream:
    """`Stream` over an asyncio StreamReader/StreamWriter pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def read(self, n: int) -> bytes:
        return await self._reader.read(n)

    async def readexactly(self, n: int) -> bytes:
        return await self._reader.readexactly(n)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def reset(self) -> None:
        self._writer.transport.abort()


def _pack_hello(peer_id: str, protocol: str) -> bytes:
    fields = [peer_id.encode(), protocol.encode()]
    if any(len(f) > MAX_HELLO_FIELD or not f for f in fields):
        raise TransportError("peer id and protocol must be 1..255 bytes")
    return b"".join(struct.pack(">B", len(f)) + f for f in fields)


async def _read_hello(reader: asyncio.StreamReader) -> tuple[str, str]:
    fields = []
    for _ in range(2):
        (length,) = struct.unpack(">B", await reader.readexactly(1))
        if length == 0:
            raise TransportError("empty hello field")
        fields.append((await reader.readexactly(length)).decode("utf-8"))
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
        self._server = await asyncio.start_server(self._on_connection, self._host, self._port,
                                                  limit=READ_BUFFER_BYTES)
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
            reader, writer = await asyncio.open_connection(*address, limit=READ_BUFFER_BYTES)
        except OSError as exc:
            raise TransportError(f"cannot connect to {peer_id} at {address}: {exc}") from exc
        stream = TcpStream(reader, writer)
        await stream.write(_pack_hello(self.my_id, protocol))
        return stream

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        stream = TcpStream(reader, writer)
        self._streams.add(stream)
        try:
            try:
                remote, protocol = await asyncio.wait_for(_read_hello(reader), HELLO_TIMEOUT_S)
            except (asyncio.IncompleteReadError, UnicodeDecodeError, TransportError, TimeoutError):
                stream.reset()
                return
            handler = self._handlers.get(protocol)
            if handler is None:
                stream.reset()
                return
            await handler(stream, remote)
        finally:
            self._tasks.discard(task)
            self._streams.discard(stream)
            await stream.close()

"""Interop of our sans-I/O yamux core with py-libp2p 0.8.1's Yamux, both ways, inside one trio run.

Our core needs no event loop, so a few lines of trio drive it against py-libp2p's muxer over an
in-memory pipe: an echo of 1 MiB (several window updates) with half-close, in each direction.
"""
import os

import pytest

from node.p2p.yamux import DataReceived, StreamEnded, YamuxSession

trio = pytest.importorskip("trio")
pytest.importorskip("libp2p")
from libp2p.peer.id import ID  # noqa: E402
from libp2p.stream_muxer.exceptions import MuxedStreamEOF  # noqa: E402
from libp2p.stream_muxer.yamux.yamux import Yamux  # noqa: E402

PAYLOAD_SIZE = 1024 * 1024


class TrioPipeConn:
    """The part of py-libp2p's ISecureConn that its Yamux uses, over trio memory channels."""

    def __init__(self, send, receive, is_initiator: bool) -> None:
        self._send, self._receive = send, receive
        self._buffer = b""
        self.is_initiator = is_initiator

    async def read(self, n: int | None = None) -> bytes:
        if not self._buffer:
            try:
                self._buffer = await self._receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return b""
        size = len(self._buffer) if n is None or n < 0 else n
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    async def write(self, data: bytes) -> None:
        await self._send.send(bytes(data))

    async def close(self) -> None:
        await self._send.aclose()

    def get_remote_address(self):
        return None


class CoreDriver:
    """Drives our YamuxSession from trio; with `echo`, every inbound stream's bytes go back."""

    def __init__(self, session: YamuxSession, send, receive, echo: bool) -> None:
        self.session, self._send, self._receive, self._echo = session, send, receive, echo
        self.pending: dict[int, bytearray] = {}  # bytes waiting for send window
        self.fin_when_sent: set[int] = set()
        self.remote_ended: set[int] = set()
        self.received: dict[int, bytearray] = {}

    async def run(self) -> None:
        session = self.session
        async for chunk in self._receive:
            for event in session.receive_data(chunk, trio.current_time()):
                sid = getattr(event, "stream_id", None)
                if type(event) is DataReceived:
                    self.received.setdefault(sid, bytearray()).extend(event.data)
                    if self._echo:
                        self.pending.setdefault(sid, bytearray()).extend(event.data)
                    session.acknowledge_received(sid, len(event.data), trio.current_time())
                elif type(event) is StreamEnded:
                    self.remote_ended.add(sid)
                    if self._echo:
                        self.fin_when_sent.add(sid)
            await self.send_pending()

    async def send_pending(self) -> None:
        session = self.session
        for sid, data in self.pending.items():
            if data and session.has_stream(sid):
                del data[:session.send_data(sid, bytes(data))]
        for sid in [s for s in self.fin_when_sent if not self.pending.get(s)]:
            self.fin_when_sent.discard(sid)
            if session.has_stream(sid):
                session.end_stream(sid)
        out = session.data_to_send()
        if out:
            await self._send.send(out)


def channels():
    a_send, b_receive = trio.open_memory_channel(64)
    b_send, a_receive = trio.open_memory_channel(64)
    return (a_send, a_receive), (b_send, b_receive)


def test_pylibp2p_opens_stream_and_our_core_echoes():
    payload = os.urandom(PAYLOAD_SIZE)

    async def main():
        (py_send, py_receive), (our_send, our_receive) = channels()
        theirs = Yamux(TrioPipeConn(py_send, py_receive, True), ID(b"\x00" * 34), is_initiator=True)
        ours = CoreDriver(YamuxSession(False), our_send, our_receive, echo=True)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ours.run)
                nursery.start_soon(theirs.start)
                await theirs.event_started.wait()
                stream = await theirs.open_stream()

                async def send():
                    for i in range(0, PAYLOAD_SIZE, 100_000):
                        await stream.write(payload[i:i + 100_000])
                    await stream.close()
                nursery.start_soon(send)
                assert await read_to_eof(stream) == payload
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_our_core_opens_stream_and_pylibp2p_echoes():
    payload = os.urandom(PAYLOAD_SIZE)

    async def main():
        (py_send, py_receive), (our_send, our_receive) = channels()
        theirs = Yamux(TrioPipeConn(py_send, py_receive, False), ID(b"\x00" * 34), is_initiator=False)
        ours = CoreDriver(YamuxSession(True), our_send, our_receive, echo=False)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(theirs.start)

                async def echo_server():
                    stream = await theirs.accept_stream()
                    while data := await read_some(stream):
                        await stream.write(data)
                    await stream.close()
                nursery.start_soon(echo_server)
                await theirs.event_started.wait()
                sid = ours.session.open_stream()
                ours.pending[sid] = bytearray(payload)
                ours.fin_when_sent.add(sid)
                ours.session.send_ping(trio.current_time())
                await ours.send_pending()
                nursery.start_soon(ours.run)
                while sid not in ours.remote_ended:
                    await trio.sleep(0.01)
                assert bytes(ours.received[sid]) == payload
                assert ours.session.rtt is not None  # py-libp2p answered our ping
                assert not ours.session.has_stream(sid)  # FIN both ways
                nursery.cancel_scope.cancel()

    trio.run(main)


async def read_to_eof(stream) -> bytes:
    parts = []
    while data := await read_some(stream):
        parts.append(data)
    return b"".join(parts)


async def read_some(stream) -> bytes:
    try:
        return await stream.read(65536)
    except MuxedStreamEOF:
        return b""

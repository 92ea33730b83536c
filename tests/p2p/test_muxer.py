"""Tests of the asyncio yamux driver over in-memory pipes and loopback TCP."""
import asyncio
import contextlib
import os
import random

import pytest

from node.p2p import yamux as y
from node.p2p.muxer import MuxedConnection, MuxerClosedError, StreamResetError

CHUNK = 65535  # what the noise layer below hands out at most


class PipeEnd:
    """One end of an in-memory, bounded, chunked byte pipe with the secured-connection API."""

    def __init__(self, inbox: asyncio.Queue, outbox: asyncio.Queue) -> None:
        self._inbox, self._outbox = inbox, outbox
        self.closed = False

    async def read(self) -> bytes:
        if self.closed:
            return b""
        return await self._inbox.get()

    async def write(self, data) -> None:
        if self.closed:
            raise ConnectionResetError("pipe closed")
        data = b"".join(data) if isinstance(data, list) else data  # the muxer sends lists of buffers
        for i in range(0, len(data), CHUNK):
            await self._outbox.put(bytes(data[i:i + CHUNK]))

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._outbox.put_nowait(b"")  # EOF for the peer
            self._inbox.put_nowait(b"")


class _Queue(asyncio.Queue):
    """Bounded for data, but EOF markers always fit."""

    def put_nowait(self, item):
        if item == b"":
            self._put(item)
            self._wakeup_next(self._getters)
            return
        super().put_nowait(item)


def memory_pipe(max_chunks: int = 16) -> tuple[PipeEnd, PipeEnd]:
    a_to_b, b_to_a = _Queue(max_chunks), _Queue(max_chunks)
    return PipeEnd(b_to_a, a_to_b), PipeEnd(a_to_b, b_to_a)


class TcpConn:
    """asyncio TCP streams with the secured-connection API."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self) -> bytes:
        return await self._reader.read(CHUNK)

    async def write(self, data) -> None:
        self._writer.writelines(data if isinstance(data, list) else [data])
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


async def tcp_pair() -> tuple[TcpConn, TcpConn, asyncio.Server]:
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(lambda r, w: accepted.set_result(TcpConn(r, w)), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = TcpConn(*await asyncio.open_connection("127.0.0.1", port))
    return client, await accepted, server


async def echo(stream) -> None:
    while data := await stream.read():
        await stream.write(data)
    await stream.close()


async def muxed_pair(on_stream=echo, *, tcp=False, **kw):
    if tcp:
        ca, cb, server = await tcp_pair()
        server.close()
    else:
        ca, cb = memory_pipe()
    a = MuxedConnection(ca, True, None, **kw)
    b = MuxedConnection(cb, False, on_stream, **kw)
    await a.start()
    await b.start()
    return a, b


async def read_all(stream) -> bytes:
    parts = []
    while data := await stream.read():
        parts.append(data)
    return b"".join(parts)


def run(coro, timeout: float = 30.0):
    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro
    return asyncio.run(bounded())


# ------------------------------------------------------------------ data path

@pytest.mark.parametrize("tcp", [False, True])
def test_echo_intact_and_half_close(tcp):
    async def main():
        a, b = await muxed_pair(tcp=tcp)
        stream = await a.open_stream()
        payload = os.urandom(3 * 1024 * 1024 + 7)
        writer = asyncio.create_task(stream.write(payload))
        got = await stream.readexactly(len(payload) // 2)
        await writer
        await stream.close()  # half-close: the echo still comes back
        got += await read_all(stream)
        assert got == payload
        assert await stream.read() == b""
        with pytest.raises(BrokenPipeError):
            await stream.write(b"x")
        await asyncio.sleep(0.05)
        assert a.num_streams == 0 and b.num_streams == 0
        await a.close()
        await b.close()
    run(main())


def test_readexactly_raises_incomplete_read_at_eof():
    async def main():
        async def send_three(stream):
            await stream.write(b"abc")
            await stream.close()
        a, b = await muxed_pair(send_three)
        stream = await a.open_stream()
        assert await stream.readexactly(2) == b"ab"
        with pytest.raises(asyncio.IncompleteReadError) as info:
            await stream.readexactly(5)
        assert info.value.partial == b"c"
        await a.close()
        await b.close()
    run(main())


@pytest.mark.parametrize("stall_seconds", [2.0, pytest.param(8.0, marks=pytest.mark.slow)])
def test_slow_reader_blocks_writer_without_reset_or_unbounded_buffer(stall_seconds):
    async def main():
        accepted: asyncio.Queue = asyncio.Queue()

        async def park(stream):
            await accepted.put(stream)
            await asyncio.Event().wait()  # keep the handler alive; reading happens in the test

        a, b = await muxed_pair(park, tcp=True, keepalive_interval=0.2, keepalive_timeout=2.0)
        stream = await a.open_stream()
        payload = os.urandom(8 * 1024 * 1024)
        writer = asyncio.create_task(stream.write(payload))
        remote = await accepted.get()
        await asyncio.sleep(stall_seconds)  # py-libp2p resets a stream stalled for 5 s; we never do
        assert not writer.done()
        assert remote.buffered <= y.INITIAL_WINDOW  # nothing read: the window never grew
        assert not a.closed and not b.closed
        got = await remote.readexactly(len(payload))
        await writer
        assert got == payload
        await a.close()
        await b.close()
    run(main())


def test_many_streams_in_parallel_share_the_connection_fairly():
    async def main():
        a, b = await muxed_pair(tcp=True)

        async def roundtrip(i):
            stream = await a.open_stream()
            payload = os.urandom(100_000 + i)
            writer = asyncio.create_task(stream.write(payload))
            got = await stream.readexactly(len(payload))
            await writer
            await stream.close()
            assert await stream.read() == b""
            return got == payload

        assert all(await asyncio.gather(*(roundtrip(i) for i in range(50))))
        await a.close()
        await b.close()
    run(main())


def test_ten_thousand_concurrent_streams():
    async def main():
        a, b = await muxed_pair()
        streams = [await a.open_stream() for _ in range(10_000)]
        assert a.num_streams == 10_000
        for stream in streams:
            await stream.write(stream.stream_id.to_bytes(4, "big"))
        replies = [await s.readexactly(4) for s in streams]
        assert [int.from_bytes(r, "big") for r in replies] == [s.stream_id for s in streams]
        assert b.num_streams == 10_000
        await a.close()
        await b.close()
    run(main(), timeout=120)


# ------------------------------------------------------------ reset and close

def test_reset_reaches_the_peer_and_fails_blocked_writer():
    async def main():
        accepted: asyncio.Queue = asyncio.Queue()

        async def park(stream):
            await accepted.put(stream)
            await asyncio.Event().wait()

        a, b = await muxed_pair(park)
        stream = await a.open_stream()
        writer = asyncio.create_task(stream.write(bytes(2 * y.INITIAL_WINDOW)))
        remote = await accepted.get()
        reader = asyncio.create_task(remote.read(1))
        await asyncio.sleep(0.05)
        assert not writer.done()
        remote.reset()
        with pytest.raises(StreamResetError):
            await writer
        await asyncio.sleep(0)
        assert reader.done()  # the first chunk was readable before the reset
        with pytest.raises(StreamResetError):
            await remote.read()
        with pytest.raises(StreamResetError):
            await stream.read()
        assert a.num_streams == 0 and b.num_streams == 0
        await a.close()
        await b.close()
    run(main())


def test_close_sends_go_away_and_peer_shuts_down_streams():
    async def main():
        a, b = await muxed_pair(tcp=True)
        stream = await a.open_stream()
        await stream.write(b"ping")
        assert await stream.readexactly(4) == b"ping"
        await b.close()
        assert b.closed
        with pytest.raises(StreamResetError):
            await stream.read()
        for _ in range(500):
            if a.closed:
                break
            await asyncio.sleep(0.01)
        assert a.closed
        with pytest.raises(MuxerClosedError):
            await a.open_stream()
    run(main())


def test_graceful_close_lets_open_streams_finish_and_refuses_new_ones():
    async def main():
        a, b = await muxed_pair(tcp=True)
        stream = await a.open_stream()
        await stream.write(b"before")
        assert await stream.readexactly(6) == b"before"
        closing = asyncio.create_task(b.close(drain_timeout=5.0))
        await asyncio.sleep(0.05)
        with pytest.raises(MuxerClosedError, match="GoAway"):
            await a.open_stream()
        await stream.write(b"after GoAway")
        assert await stream.readexactly(12) == b"after GoAway"
        assert not closing.done()
        await stream.close()
        assert await stream.read() == b""
        await asyncio.wait_for(closing, 2.0)
        assert b.closed
        await a.close()
    run(main())


def test_data_finished_before_the_connection_drops_stays_readable():
    async def main():
        accepted: asyncio.Queue = asyncio.Queue()

        async def reply_and_hang_up(stream):
            await stream.write(b"last words")
            await stream.close()
            await accepted.put(stream)

        a, b = await muxed_pair(reply_and_hang_up)
        finished, unfinished = await a.open_stream(), await a.open_stream()
        await accepted.get()
        await accepted.get()
        await unfinished.readexactly(4)  # half of the reply read; it ended too
        await asyncio.sleep(0.05)
        await b.close()
        for _ in range(500):
            if a.closed:
                break
            await asyncio.sleep(0.01)
        assert a.closed
        assert await finished.readexactly(10) == b"last words"
        assert await finished.read() == b""
        assert await unfinished.read() == b" words"
        with pytest.raises(ConnectionError):
            await finished.write(b"too late")
    run(main())


def test_stream_limit_resets_streams_beyond_it():
    async def main():
        async def hold(stream):
            await asyncio.Event().wait()

        near, far = memory_pipe()
        a, b = MuxedConnection(near, True, None), MuxedConnection(far, False, hold, max_streams=3)
        await a.start()
        await b.start()
        streams = [await a.open_stream() for _ in range(4)]
        with pytest.raises(StreamResetError):
            await streams[3].read()
        assert b.num_streams == 3 and not a.closed
        await a.close()
        await b.close()
    run(main())


def test_inbound_streams_are_refused_without_handler():
    async def main():
        a, b = await muxed_pair()
        stream = await b.open_stream()  # a has no on_stream handler
        with pytest.raises(StreamResetError):
            await stream.read()
        await a.close()
        await b.close()
    run(main())


# -------------------------------------------------------------- pings, liveness

def test_ping_returns_rtt():
    async def main():
        a, b = await muxed_pair(tcp=True)
        rtt = await a.ping()
        assert 0 < rtt < 1.0
        assert a.rtt == rtt
        await a.close()
        await b.close()
    run(main())


def test_keepalive_closes_a_silent_connection():
    async def main():
        near, far = memory_pipe(max_chunks=1000)
        a = MuxedConnection(near, True, None, keepalive_interval=0.1, keepalive_timeout=0.2)
        await a.start()
        drained = asyncio.create_task(drain(far))  # a peer that reads but never answers
        for _ in range(250):
            if a.closed:
                break
            await asyncio.sleep(0.02)
        assert a.closed and "keepalive" in a.close_reason
        drained.cancel()
    run(main())


async def drain(conn) -> None:
    while await conn.read():
        pass


def test_keepalive_keeps_a_live_idle_connection():
    async def main():
        a, b = await muxed_pair(keepalive_interval=0.05, keepalive_timeout=2.0)
        await asyncio.sleep(0.5)
        assert not a.closed and not b.closed
        await a.close()
        await b.close()
    run(main())


# -------------------------------------------------------------------- bad peer

@pytest.mark.parametrize("junk", [
    b"\x01" + bytes(11),  # bad version
    y.encode_header(y.TYPE_DATA, 0, 1, 2**31),  # absurd length on an unknown stream
    y.encode_header(y.TYPE_WINDOW_UPDATE, y.FLAG_SYN, 2, 0),  # initiator's parity from responder side
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_garbage_peer_closes_only_its_connection(junk):
    async def main():
        good_a, good_b = await muxed_pair()
        near, far = memory_pipe()
        victim = MuxedConnection(near, False, echo)
        await victim.start()
        await far.write(junk)
        for _ in range(500):
            if victim.closed:
                break
            await asyncio.sleep(0.01)
        assert victim.closed and "protocol error" in victim.close_reason
        reply = b""
        while chunk := await far.read():  # the victim answered with GoAway(protocol error)
            reply += chunk
        assert y.encode_header(y.TYPE_GO_AWAY, 0, 0, y.GO_AWAY_PROTOCOL_ERROR) in reply
        stream = await good_a.open_stream()
        await stream.write(b"still serving")
        assert await stream.readexactly(13) == b"still serving"
        await good_a.close()
        await good_b.close()
    run(main())


def test_reads_of_any_size_return_the_byte_stream_in_order():
    async def main():
        rng = random.Random(7)
        payload = os.urandom(600_000)

        async def send_in_random_pieces(stream):
            pos = 0
            while pos < len(payload):
                size = rng.choice([1, 7, 100, 5000, 70_000])
                await stream.write(payload[pos:pos + size])
                pos += size
            await stream.close()

        a, b = await muxed_pair(send_in_random_pieces)
        stream = await a.open_stream()
        got = bytearray()
        while True:
            size = rng.choice([-1, 1, 3, 12, 4096, 20_000, 100_000])
            if rng.random() < 0.3:
                size = min(abs(size), len(payload) - len(got)) or 1
                if len(got) + size > len(payload):
                    break
                data = await stream.readexactly(size)
                assert len(data) == size
            else:
                data = await stream.read(size)
                assert size < 0 or len(data) <= size
                if not data:
                    break
            got += data
        assert await stream.read() == b""
        assert bytes(got) == payload
        await a.close()
        await b.close()
    run(main())


def test_concurrent_readers_or_writers_on_one_stream_are_refused():
    async def main():
        async def hold(stream):
            await asyncio.Event().wait()

        a, b = await muxed_pair(hold)
        stream = await a.open_stream()
        first_reader = asyncio.create_task(stream.read())
        first_writer = asyncio.create_task(stream.write(bytes(2 * y.INITIAL_WINDOW)))
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="already reading"):
            await stream.read()
        with pytest.raises(RuntimeError, match="already writing"):
            await stream.write(b"x")
        stream.reset()
        for task in (first_reader, first_writer):
            with pytest.raises(StreamResetError):
                await task
        await a.close()
        await b.close()
    run(main())


def test_writes_of_mutable_buffers_are_not_copied_and_may_be_reused_at_once():
    """A bytearray/memoryview write is sent from the caller's buffer (no snapshot) and returns
    only once the connection took it: refilling the buffer right away never corrupts the data."""
    import array

    async def main():
        got = asyncio.get_running_loop().create_future()

        async def collect(stream):
            got.set_result(await read_all(stream))

        a, b = await muxed_pair(collect)
        stream = await a.open_stream()
        buffer = bytearray(300_000)
        expected = []
        for fill in range(1, 6):
            buffer[:] = bytes([fill]) * len(buffer)
            expected.append(bytes(buffer))
            await stream.write(buffer)
        numbers = array.array("i", range(1000))  # a typed buffer goes out as its raw bytes
        await stream.write(memoryview(numbers))
        await stream.write(memoryview(bytes(range(256)) * 10)[::2])  # non-contiguous: copied
        await stream.close()
        assert await got == b"".join(expected) + numbers.tobytes() + (bytes(range(256)) * 10)[::2]
        await a.close()
        await b.close()
    run(main())

"""TcpStream (in-place receiving) over 127.0.0.1: half-close in both directions, interleaved large
and small frames, peers that end or die mid-frame, bounded memory under a slow consumer, and the
same outcomes as the StreamReader/StreamWriter stream it replaced in every case the group uses."""
import asyncio
import contextlib
import hashlib
import socket
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
import uvloop
from loopback_groups import make_groups

from ml.allreduce.transport import DIRECT_READ_BYTES, READ_BUFFER_BYTES, SCRATCH_BYTES, TcpStream, TcpTransport
from ml.allreduce.wire import MAX_META_BYTES, Frame, Kind, encode_frame, read_frame

TIMEOUT_S = 10.0


def run(coro, loop_factory=None):
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(asyncio.wait_for(coro, 60))


LOOPS = {"asyncio": None, "uvloop": uvloop.new_event_loop}  # the node runs uvloop, tests and bench asyncio


class StreamReaderStream:
    """The stream TcpStream replaced (asyncio StreamReader/StreamWriter), as the reference."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self._transport = writer.transport

    async def read(self, n):
        return await self._reader.read(n)

    async def readexactly(self, n):
        return await self._reader.readexactly(n)

    async def write(self, data):
        self._writer.write(data)
        await self._writer.drain()

    def write_eof(self):
        self._writer.write_eof()

    async def close(self):
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def reset(self):
        self._writer.transport.abort()


@contextlib.asynccontextmanager
async def stream_pair(kind: str = "inplace"):
    """(dialer's stream, listener's stream) over one loopback connection."""
    accepted = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def hold(stream, remote=None):  # the listener's stream lives while the test runs
        accepted.set_result(stream)
        await done.wait()

    if kind == "inplace":
        server, client = TcpTransport("listener"), TcpTransport("dialer")
        server.set_handler("/t", hold)
        client.addresses["listener"] = await server.start()
        dialer = await client.open_stream("listener", "/t")
    else:
        server = await asyncio.start_server(lambda r, w: hold(StreamReaderStream(r, w)), "127.0.0.1", 0)
        dialer = StreamReaderStream(*await asyncio.open_connection(*server.sockets[0].getsockname()[:2]))
    listener = await asyncio.wait_for(accepted, TIMEOUT_S)
    try:
        yield dialer, listener
    finally:
        done.set()
        dialer.reset()
        listener.reset()
        if kind == "inplace":
            await server.close()
        else:
            server.close()
            await server.wait_closed()


def blob(n: int, seed: int) -> bytes:
    pattern = bytes((seed + 7 * i) % 251 for i in range(251))
    return (pattern * (n // 251 + 1))[:n]


def rst_on_reset(stream) -> None:
    """Make `stream.reset()` send a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = stream._transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


# -- half-close --------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("closing_side", ["dialer", "listener"])
def test_after_one_side_half_closes_the_other_keeps_writing_and_its_data_arrives(closing_side, loop):
    async def main():
        async with stream_pair() as (dialer, listener):
            closer, writer = (dialer, listener) if closing_side == "dialer" else (listener, dialer)
            await closer.write(b"last words")
            closer.write_eof()
            assert await writer.readexactly(10) == b"last words"
            assert await asyncio.wait_for(writer.read(100), TIMEOUT_S) == b""  # EOF
            with pytest.raises(asyncio.IncompleteReadError):
                await writer.readexactly(1)
            payload = blob(6 << 20, 3)  # more than every buffer on the way: needs the peer reading
            send = asyncio.ensure_future(writer.write(payload))
            got = bytes(await asyncio.wait_for(closer.readexactly(len(payload)), TIMEOUT_S))
            await asyncio.wait_for(send, TIMEOUT_S)
            assert got == payload
            await writer.write(b"still open")
            assert await asyncio.wait_for(closer.readexactly(10), TIMEOUT_S) == b"still open"
    run(main(), LOOPS[loop])


# -- frames ------------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
def test_large_and_small_frames_interleaved_arrive_intact_through_read_frame(loop):
    sizes = [0, 1, 30, DIRECT_READ_BYTES - 1, DIRECT_READ_BYTES, 1 << 20, 5, (1 << 20) + 3, 0,
             3 * DIRECT_READ_BYTES + 1, 2, 4 << 20, 17, DIRECT_READ_BYTES + 1]
    frames = [Frame(Kind.PART if i % 3 else Kind.PING, 7, 1, i, i * 2, {"i": i} if i % 2 else {},
                    (blob(n // 2, i), memoryview(blob(n - n // 2, i + 1))) if n else b"")
              for i, n in enumerate(sizes)]

    async def main():
        async with stream_pair() as (dialer, listener):
            async def send_all():
                for frame in frames:
                    for buf in encode_frame(frame):
                        await dialer.write(buf)

            sender = asyncio.ensure_future(send_all())
            for sent in frames:
                got = await asyncio.wait_for(read_frame(listener), TIMEOUT_S)
                assert (got.kind, got.round_id, got.attempt, got.slot, got.chunk, got.meta) == \
                       (sent.kind, sent.round_id, sent.attempt, sent.slot, sent.chunk, sent.meta)
                expected = b"".join(bytes(p) for p in sent.payload) if isinstance(sent.payload, tuple) else sent.payload
                assert bytes(got.payload) == expected
            await sender
    run(main(), LOOPS[loop])


def test_reads_below_the_in_place_size_are_bytes_so_json_meta_parses_and_larger_ones_memoryviews():
    assert DIRECT_READ_BYTES > MAX_META_BYTES

    async def main():
        async with stream_pair() as (dialer, listener):
            await dialer.write(b"a" * MAX_META_BYTES + b"b" * DIRECT_READ_BYTES)
            await asyncio.sleep(0.1)  # both reads are served from bytes already received
            small = await listener.readexactly(MAX_META_BYTES)
            large = await listener.readexactly(DIRECT_READ_BYTES)
            assert isinstance(small, bytes) and small == b"a" * MAX_META_BYTES
            assert isinstance(large, memoryview) and bytes(large) == b"b" * DIRECT_READ_BYTES
    run(main())


def test_read_returns_what_is_there_and_read_all_waits_for_eof():
    async def main():
        async with stream_pair() as (dialer, listener):
            await dialer.write(b"hello")
            assert await asyncio.wait_for(listener.read(100), TIMEOUT_S) == b"hello"
            assert await listener.read(0) == b""
            await dialer.write(b"x" * 300_000)
            dialer.write_eof()
            assert await asyncio.wait_for(listener.read(-1), TIMEOUT_S) == b"x" * 300_000
            assert await listener.read(10) == b""
    run(main())


# -- ends, deaths and resets ---------------------------------------------------------------------

DYING_PEER = textwrap.dedent("""
    import os, socket, sys
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    hello = bytes([4]) + b"dead" + bytes([2]) + b"/t"
    s.sendall(hello + bytes(range(256)) * int(sys.argv[2]))
    os._exit(0)  # dies mid-frame: the kernel closes the connection
""")


@pytest.mark.parametrize("sent", [1000, DIRECT_READ_BYTES * 3])  # a small and an in-place read
def test_a_peer_that_dies_mid_frame_gives_the_reader_an_incomplete_read_with_the_partial_bytes(sent):
    async def main():
        outcome = asyncio.get_running_loop().create_future()

        async def handler(stream, remote):
            try:
                await stream.readexactly(sent + 12345)
            except Exception as exc:  # noqa: BLE001 - the outcome under test
                outcome.set_result(exc)

        server = TcpTransport("listener")
        server.set_handler("/t", handler)
        _, port = await server.start()
        proc = subprocess.Popen([sys.executable, "-c", DYING_PEER, str(port), str(sent // 256)])
        try:
            exc = await asyncio.wait_for(outcome, TIMEOUT_S)
        finally:
            proc.kill()
            proc.wait()
            await server.close()
        assert isinstance(exc, asyncio.IncompleteReadError)
        assert bytes(exc.partial) == bytes(range(256)) * (sent // 256)
        assert exc.expected == sent + 12345
    run(main())


def test_a_reset_mid_frame_is_a_connection_error_and_later_reads_and_writes_fail_at_once():
    async def main():
        async with stream_pair() as (dialer, listener):
            await dialer.write(b"z" * 5000)
            reading = asyncio.ensure_future(listener.readexactly(DIRECT_READ_BYTES * 2))
            await asyncio.sleep(0.05)
            rst_on_reset(dialer)
            dialer.reset()
            with pytest.raises(ConnectionResetError, match="connection lost"):
                await asyncio.wait_for(reading, TIMEOUT_S)
            with pytest.raises(ConnectionResetError):
                await listener.readexactly(1)
            with pytest.raises(ConnectionResetError):
                await listener.read(1)
            with pytest.raises(ConnectionError):
                await listener.write(b"after the reset")
    run(main())


def test_close_flushes_what_was_written_and_writing_after_close_fails():
    async def main():
        async with stream_pair() as (dialer, listener):
            payload = blob(3 << 20, 9)
            await dialer.write(payload)
            closing = asyncio.ensure_future(dialer.close())
            assert bytes(await asyncio.wait_for(listener.readexactly(len(payload)), TIMEOUT_S)) == payload
            with pytest.raises(asyncio.IncompleteReadError) as ended:
                await listener.readexactly(1)
            assert ended.value.partial == b""
            await asyncio.wait_for(closing, TIMEOUT_S)
            with pytest.raises(ConnectionError):
                await dialer.write(b"too late")
    run(main())


def test_two_concurrent_readers_are_refused():
    async def main():
        async with stream_pair() as (_, listener):
            first = asyncio.ensure_future(listener.readexactly(10))
            await asyncio.sleep(0.01)
            with pytest.raises(RuntimeError, match="already reading"):
                await listener.readexactly(10)
            first.cancel()
    run(main())


# -- flow control --------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", LOOPS)
def test_a_slow_consumer_pauses_the_sender_instead_of_buffering_without_bound(loop):
    total, piece = 64 << 20, 1 << 20

    async def main():
        async with stream_pair() as (dialer, listener):
            written = 0

            async def send_all():
                nonlocal written
                data = memoryview(bytes(range(256)) * (piece // 256))
                while written < total:
                    await dialer.write(data)
                    written += piece

            sender = asyncio.ensure_future(send_all())
            await asyncio.sleep(1.0)  # nobody reads
            stalled_at = written
            unread = len(listener._protocol._unread)
            await asyncio.sleep(0.3)
            assert not sender.done() and written == stalled_at < total  # back-pressure reached the writer
            assert unread <= READ_BUFFER_BYTES + SCRATCH_BYTES  # and the reader stopped buffering
            digest, received = hashlib.sha256(), 0
            while received < total:  # now read everything, in frame-sized pieces
                chunk = await asyncio.wait_for(listener.readexactly(min(piece + 17, total - received)), TIMEOUT_S)
                digest.update(chunk)
                received += len(chunk)
                assert len(listener._protocol._unread) <= READ_BUFFER_BYTES + SCRATCH_BYTES
            await asyncio.wait_for(sender, TIMEOUT_S)
            assert digest.digest() == hashlib.sha256(bytes(range(256)) * (total // 256)).digest()
    run(main(), LOOPS[loop])


# -- the same outcomes as the StreamReader stream --------------------------------------------

async def scenario_clean_close_between_frames(dialer, listener):
    await dialer.write(b"A" * 100 + b"B" * (DIRECT_READ_BYTES * 2))
    await dialer.close()
    first, second = await listener.readexactly(100), await listener.readexactly(DIRECT_READ_BYTES * 2)
    try:
        await listener.readexactly(30)
    except asyncio.IncompleteReadError as exc:
        return bytes(first) == b"A" * 100 and bytes(second) == b"B" * (DIRECT_READ_BYTES * 2), "incomplete", exc.partial
    return "no error"


async def scenario_close_mid_frame(dialer, listener):
    await dialer.write(b"C" * 777)
    await dialer.close()
    try:
        await listener.readexactly(DIRECT_READ_BYTES * 4)
    except asyncio.IncompleteReadError as exc:
        return "incomplete", bytes(exc.partial) == b"C" * 777
    return "no error"


async def scenario_rst_mid_frame(dialer, listener):
    await dialer.write(b"D" * 10)
    rst_on_reset(dialer)
    dialer.reset()
    try:
        await listener.readexactly(100)
    except ConnectionError:
        return "connection error"
    except asyncio.IncompleteReadError:
        return "incomplete"
    return "no error"


async def scenario_local_reset_while_reading(dialer, listener):
    reading = asyncio.ensure_future(listener.readexactly(DIRECT_READ_BYTES * 2))
    await asyncio.sleep(0.05)
    listener.reset()
    try:
        await reading
    except asyncio.IncompleteReadError as exc:
        return "incomplete", exc.partial
    return "no error"


async def scenario_writer_after_reader_closed(dialer, listener):
    await listener.close()  # the group's reader ends (bad frame, exclusion): the writer must learn it
    for _ in range(200):
        try:
            await dialer.write(b"E" * 65536)
        except ConnectionError:
            return "connection error"
        await asyncio.sleep(0.01)
    return "no error"


async def scenario_writer_keeps_writing_after_peer_half_closed(dialer, listener):
    listener.write_eof()
    await asyncio.sleep(0.05)
    for _ in range(20):
        await dialer.write(b"F" * 65536)
    return bytes(await listener.readexactly(20 * 65536)) == b"F" * 20 * 65536


async def scenario_cancelled_read_consumes_nothing(dialer, listener):
    payload = blob(DIRECT_READ_BYTES * 3, 5)
    await dialer.write(payload[:DIRECT_READ_BYTES])
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(listener.readexactly(len(payload)), 0.2)  # times out half-way
    await dialer.write(payload[DIRECT_READ_BYTES:])
    return bytes(await listener.readexactly(len(payload))) == payload


@pytest.mark.parametrize("scenario", [
    scenario_clean_close_between_frames, scenario_close_mid_frame, scenario_rst_mid_frame,
    scenario_local_reset_while_reading, scenario_writer_after_reader_closed,
    scenario_writer_keeps_writing_after_peer_half_closed, scenario_cancelled_read_consumes_nothing,
], ids=lambda f: f.__name__.removeprefix("scenario_"))
def test_outcome_matches_the_streamreader_stream(scenario):
    async def outcome(kind):
        async with stream_pair(kind) as (dialer, listener):
            return await asyncio.wait_for(scenario(dialer, listener), TIMEOUT_S)

    async def main():
        reference = await outcome("streamreader")
        assert reference != "no error"
        assert await outcome("inplace") == reference

    run(main())


def test_stream_is_a_tcpstream_with_nodelay():
    async def main():
        async with stream_pair() as (dialer, listener):
            assert isinstance(dialer, TcpStream) and isinstance(listener, TcpStream)
            for stream in (dialer, listener):
                sock = stream._transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    run(main())


# -- the group on in-place payloads ---------------------------------------------------------------

@pytest.mark.parametrize("codec,mode,bound", [("fp32", "butterfly", 0.0), ("fp32", "ring", 1e-6),
                                              ("fp16", "butterfly", 1e-3), ("int4", "butterfly", 0.25)])
def test_group_rounds_with_chunks_received_in_place(codec, mode, bound, monkeypatch):
    """Chunks of 2^18 values: every codec's frames are >= DIRECT_READ_BYTES (int4: 128 KiB + header),
    so contributions and results are memoryviews of in-place buffers, not bytes."""
    n, numel = 3, 1_000_000
    in_place = []
    readexactly = TcpStream.readexactly

    async def counting_readexactly(self, size):
        data = await readexactly(self, size)
        in_place.append(isinstance(data, memoryview))
        return data

    monkeypatch.setattr(TcpStream, "readexactly", counting_readexactly)

    async def main():
        groups, transports = await make_groups(n, codec=codec, mode=mode, chunk_numel=1 << 18)
        xs = [torch.randn(numel, generator=torch.Generator().manual_seed(40 + i)) for i in range(n)]
        try:
            for round_id in range(2):
                results = await asyncio.gather(*(g.allreduce([x], round_id) for g, x in zip(groups, xs)))
                exact = (xs[0] + xs[1] + xs[2]) / n
                err = float((results[0].tensors[0] - exact).norm() / exact.norm())
                assert err <= bound if bound else torch.equal(results[0].tensors[0], exact)
                assert all(torch.equal(r.tensors[0], results[0].tensors[0]) for r in results)
                assert all(r.attempts == 1 and r.excluded == {} for r in results)
            assert sum(in_place) >= n * (n - 1)  # round 0 has even shards: a large part per link
        finally:
            for g in groups:
                await g.close()
            for t in transports:
                await t.close()
    run(main())

"""Micro-benchmark of the yamux muxer alone (no noise) over loopback TCP between two processes.

Measures: single-stream throughput (256 MiB in 1 MiB writes) next to raw TCP, the same through an
in-memory pipe in one process (the muxer's own cost, both ends on one core), 1 KiB echo round trip
(median), concurrent streams opened and used on one connection, and memory per idle connection.
The in-memory figure also comes as bytes per CPU second (`yamux_in_memory_cpu_MBps`), which a
loaded machine disturbs less than wall-clock rates.
Usage: python bench/yamux_micro.py [--mib 256] [--streams 10000]; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from node.p2p.muxer import MuxedConnection  # noqa: E402

READ_SIZE = 256 * 1024
WRITE_SIZE = 1024 * 1024


class TcpConn:
    """asyncio TCP streams with the secured-connection API the muxer expects."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self) -> bytes:
        return await self._reader.read(READ_SIZE)

    async def write(self, parts) -> None:
        self._writer.writelines(parts)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


async def serve_stream(stream) -> None:
    """First byte picks the mode: b"S" sink (reply with the byte count), b"E" echo."""
    mode = await stream.readexactly(1)
    if mode == b"S":
        total = 0
        while data := await stream.read():
            total += len(data)
        await stream.write(total.to_bytes(8, "big"))
    else:
        while data := await stream.read():
            await stream.write(data)
    await stream.close()


async def serve_raw(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    total = 0
    while data := await reader.read(READ_SIZE):
        total += len(data)
    writer.write(total.to_bytes(8, "big"))
    await writer.drain()
    writer.close()


async def server_main(port_file: str) -> None:
    live: set[MuxedConnection] = set()

    async def on_conn(reader, writer):
        first = await reader.readexactly(1)
        if first == b"R":
            await serve_raw(reader, writer)
            return
        muxed = MuxedConnection(TcpConn(reader, writer), False, serve_stream, max_streams=20_000)
        live.add(muxed)
        await muxed.start()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    with open(port_file, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


async def connect(port: int, kind: bytes):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(kind)
    return reader, writer


async def bench_raw(port: int, total: int) -> float:
    reader, writer = await connect(port, b"R")
    block = os.urandom(WRITE_SIZE)
    start = time.perf_counter()
    for _ in range(total // WRITE_SIZE):
        writer.write(block)
        await writer.drain()
    writer.write_eof()
    assert int.from_bytes(await reader.readexactly(8), "big") == total
    elapsed = time.perf_counter() - start
    writer.close()
    return total / elapsed / 1e6


async def bench_muxed(port: int, total: int, streams: int) -> dict:
    muxed = MuxedConnection(TcpConn(*await connect(port, b"M")), True, None, max_streams=20_000)
    await muxed.start()
    block = os.urandom(WRITE_SIZE)
    stream = await muxed.open_stream()
    await stream.write(b"S")
    start = time.perf_counter()
    for _ in range(total // WRITE_SIZE):
        await stream.write(block)
    await stream.close()
    assert int.from_bytes(await stream.readexactly(8), "big") == total
    mbps = total / (time.perf_counter() - start) / 1e6

    echo = await muxed.open_stream()
    await echo.write(b"E")
    message = os.urandom(1024)
    rtts = []
    for _ in range(1000):
        t0 = time.perf_counter()
        await echo.write(message)
        await echo.readexactly(1024)
        rtts.append(time.perf_counter() - t0)
    await echo.close()

    opened = [await muxed.open_stream() for _ in range(streams)]
    for s in opened:
        await s.write(b"E" + s.stream_id.to_bytes(4, "big"))
    ok = 0
    for s in opened:
        ok += await s.readexactly(4) == s.stream_id.to_bytes(4, "big")
    await muxed.close()
    return {"yamux_MBps": round(mbps, 1), "yamux_rtt_us": round(statistics.median(rtts) * 1e6, 1),
            "streams_ok": ok}


class QueueConn:
    """One end of an in-memory pipe: no crypto, no sockets, only the muxer's own work."""

    def __init__(self, inbox: asyncio.Queue, outbox: asyncio.Queue) -> None:
        self._inbox, self._outbox = inbox, outbox

    async def read(self) -> bytes:
        return await self._inbox.get()

    async def write(self, parts) -> None:
        for part in parts:  # buffers pass through as they are, like a scatter/gather socket write
            await self._outbox.put(part)

    async def close(self) -> None:
        self._outbox.put_nowait(b"")


async def bench_in_memory(total: int) -> tuple[float, float]:
    a_to_b, b_to_a = asyncio.Queue(64), asyncio.Queue(64)
    near = MuxedConnection(QueueConn(b_to_a, a_to_b), True, None)
    far = MuxedConnection(QueueConn(a_to_b, b_to_a), False, serve_stream)
    await near.start()
    await far.start()
    stream = await near.open_stream()
    await stream.write(b"S")
    block = os.urandom(WRITE_SIZE)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(total // WRITE_SIZE):
        await stream.write(block)
    await stream.close()
    assert int.from_bytes(await stream.readexactly(8), "big") == total
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    await near.close()
    await far.close()
    return total / elapsed / 1e6, total / cpu / 1e6


class IdleConn:
    """A peer that never sends: the muxer's reader waits forever."""

    async def read(self) -> bytes:
        await asyncio.Event().wait()
        return b""

    async def write(self, parts) -> None:
        pass

    async def close(self) -> None:
        pass


async def idle_conn_kib(count: int = 200) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    conns = []
    for _ in range(count):
        muxed = MuxedConnection(IdleConn(), True, None)
        await muxed.start()
        conns.append(muxed)
    await asyncio.sleep(0.1)  # let the tasks start and park
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    for muxed in conns:
        await muxed.close()
    return round(used / count / 1024, 2)


async def client_main(port: int, mib: int, streams: int) -> dict:
    total = mib * 1024 * 1024
    result = {"raw_tcp_MBps": round(await bench_raw(port, total), 1)}
    result.update(await bench_muxed(port, total, streams))
    wall, cpu_bound = await bench_in_memory(total)
    result["yamux_in_memory_MBps"] = round(wall, 1)
    result["yamux_in_memory_cpu_MBps"] = round(cpu_bound, 1)  # bytes / CPU seconds, both ends on one core
    result["idle_conn_kib"] = await idle_conn_kib()
    return result


def run(coro):
    try:
        import uvloop
        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run(server_main(args.serve))
        return
    port_file = f"/tmp/yamux_micro_{os.getpid()}.port"
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", port_file])
    try:
        for _ in range(200):
            if os.path.exists(port_file) and open(port_file).read():
                break
            time.sleep(0.05)
        port = int(open(port_file).read())
        result = run(client_main(port, args.mib, args.streams))
    finally:
        server.kill()
        server.wait()
        with contextlib.suppress(FileNotFoundError):
            os.remove(port_file)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

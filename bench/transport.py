"""Transport benchmark: raw TCP vs our noise+yamux stack vs py-libp2p, on loopback.

Prints progress to stderr and, as its last stdout line, one JSON object:
  raw_tcp_MBps, ours_MBps, pylibp2p_MBps   one stream, 256 MiB in 1 MiB writes, receiver in
                                           its own process (MB = 10^6 bytes), wall clock
  ours_cpu_bound_MBps, pylibp2p_cpu_bound_MBps
                                           bytes / CPU seconds of the busier side: the rate when
                                           each side has a core to itself (robust on a loaded box)
  ours_rtt_us, pylibp2p_rtt_us             median 1 KiB echo round trip on an open stream
  streams_ok                               concurrent yamux streams opened and used on one
                                           connection (each echoes 1 KiB)
  idle_conn_kib, idle_conn_kib_remote      RSS growth per idle connection (dialer / listener side)
Usage: python bench/transport.py [--mib 256] [--streams 10000] [--idle 500] [--rtt 2000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from node.identity import Identity  # noqa: E402
from node.p2p.chachapoly import NAME as CIPHER_NAME  # noqa: E402
from node.p2p.host import Host  # noqa: E402
from node.p2p.limits import HostLimits  # noqa: E402

PYLIBP2P_PEER = ROOT / "tests" / "interop" / "pylibp2p_peer.py"
SINK = "/dekube/sink/1.0.0"
ECHO = "/dekube/echo/1.0.0"
RSS = "/dekube/bench/rss/1.0.0"
MIB = 1 << 20
BENCH_LIMITS = HostLimits(max_inbound_connections=4096, max_outbound_connections=4096, max_connections_per_peer=4096,
                          max_pending_inbound=1024, max_pending_inbound_per_ip=1024,
                          max_streams_per_connection=12_000)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- receiver processes
class _RawSink(asyncio.Protocol):
    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.count += len(data)
        if self.count >= self.total:
            self.transport.write(b"k")


async def serve_raw(total: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _RawSink(total), "127.0.0.1", 0)
    print(f"ADDR {server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def sink_handler(stream) -> None:
    total = 0
    cpu_start = time.process_time()
    while True:
        data = await stream.read()
        if not data:
            break
        total += len(data)
    cpu = time.process_time() - cpu_start
    await stream.write(json.dumps({"bytes": total, "cpu": cpu}).encode())
    await stream.close()


async def echo_handler(stream) -> None:
    while True:
        data = await stream.read()
        if not data:
            break
        await stream.write(data)
    await stream.close()


async def rss_handler(stream) -> None:
    await stream.write(str(rss_bytes()).encode())
    await stream.close()


async def serve_ours() -> None:
    host = Host(Identity.generate(), limits=BENCH_LIMITS)
    host.set_handler(SINK, sink_handler)
    host.set_handler(ECHO, echo_handler)
    host.set_handler(RSS, rss_handler)
    await host.start()
    print(f"ADDR {host.listen_addrs[0]}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await host.stop()


# ---------------------------------------------------------------- measurements
async def spawn(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(*args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if not line.startswith(b"ADDR "):
        raise RuntimeError(f"{args}: unexpected first line {line!r}")
    return proc, line.split()[1].decode()


async def finish(proc) -> None:
    if proc.stdin and not proc.stdin.is_closing():
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def bench_raw(mib: int) -> float:
    proc, port = await spawn(sys.executable, __file__, "--serve", "raw", "--mib", str(mib))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
        payload = bytes(MIB)
        start = time.perf_counter()
        for _ in range(mib):
            writer.write(payload)
            await writer.drain()
        assert await reader.readexactly(1) == b"k"
        elapsed = time.perf_counter() - start
        writer.close()
        return mib * MIB / elapsed / 1e6
    finally:
        await finish(proc)


async def read_all(stream) -> bytes:
    parts = []
    while True:
        data = await stream.read()
        if not data:
            return b"".join(parts)
        parts.append(data)


async def bench_ours(args) -> dict:
    proc, addr = await spawn(sys.executable, __file__, "--serve", "ours")
    host = Host(Identity.generate(), limits=BENCH_LIMITS)
    await host.start()
    result = {}
    try:
        peer = await host.connect(addr)
        local, remote = await idle_connections(host, peer, args.idle)
        result["idle_conn_kib"], result["idle_conn_kib_remote"] = local, remote
        log(f"idle connection: {local:.1f} KiB here, {remote:.1f} KiB at the listener")

        stream = await host.open_stream(peer, ECHO)
        msg = os.urandom(1024)
        samples = []
        for _ in range(args.rtt):
            t0 = time.perf_counter()
            await stream.write(msg)
            await stream.readexactly(1024)
            samples.append(time.perf_counter() - t0)
        await stream.close()
        result["ours_rtt_us"] = statistics.median(samples) * 1e6
        log(f"ours rtt: {result['ours_rtt_us']:.0f} us")

        # throughput: a dedicated bulk connection, as bulk tensor traffic uses
        bulk = await host.open_bulk_connection(peer)
        stream = await bulk.open_stream(SINK)
        payload = bytes(MIB)
        start = time.perf_counter()
        cpu_start = time.process_time()
        for _ in range(args.mib):
            await stream.write(payload)
        await stream.close()
        reply = json.loads(await read_all(stream))
        elapsed = time.perf_counter() - start
        send_cpu = time.process_time() - cpu_start
        assert reply["bytes"] == args.mib * MIB, reply
        result["ours_MBps"] = args.mib * MIB / elapsed / 1e6
        result["ours_cpu_bound_MBps"] = args.mib * MIB / max(send_cpu, reply["cpu"]) / 1e6
        log(f"ours: {result['ours_MBps']:.0f} MB/s (sender {send_cpu:.2f} s CPU, receiver {reply['cpu']:.2f} s CPU)")
        await bulk.close()

        result["streams_ok"] = await many_streams(host, peer, args.streams)
        log(f"streams ok: {result['streams_ok']}")
    finally:
        await host.stop()
        await finish(proc)
    return result


async def many_streams(host: Host, peer: str, count: int) -> int:
    bulk = await host.open_bulk_connection(peer)
    opened = []
    try:
        async def open_one():
            stream = await bulk.open_stream(ECHO)
            opened.append(stream)
            return stream

        streams = await asyncio.gather(*(open_one() for _ in range(count)))
        assert bulk.num_streams >= count  # all open at the same time

        async def use(stream) -> bool:
            msg = os.urandom(1024)
            await stream.write(msg)
            ok = await stream.readexactly(1024) == msg
            await stream.close()
            return ok and await stream.read() == b""

        results = await asyncio.gather(*(use(s) for s in streams), return_exceptions=True)
        return sum(1 for r in results if r is True)
    finally:
        await bulk.close()


async def remote_rss(host: Host, peer: str) -> int:
    stream = await host.open_stream(peer, RSS)
    return int(await read_all(stream))


async def idle_connections(host: Host, peer: str, count: int) -> tuple[float, float]:
    import gc
    gc.collect()
    await asyncio.sleep(0.5)
    before_local, before_remote = rss_bytes(), await remote_rss(host, peer)
    conns = []
    for _ in range(count):
        conns.append(await host.open_bulk_connection(peer))
    await asyncio.sleep(1.0)
    gc.collect()
    after_local, after_remote = rss_bytes(), await remote_rss(host, peer)
    for conn in conns:
        await conn.close()
    return (after_local - before_local) / count / 1024, (after_remote - before_remote) / count / 1024


async def bench_pylibp2p(args) -> dict:
    proc, addr = await spawn(sys.executable, str(PYLIBP2P_PEER), "listen")
    result = {}
    try:
        for mode, arg in (("send", args.mib), ("rtt", args.rtt)):
            client = await asyncio.create_subprocess_exec(
                sys.executable, str(PYLIBP2P_PEER), mode, addr, str(arg),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
            out, _ = await asyncio.wait_for(client.communicate(), 600)
            data = json.loads(out.decode().strip().splitlines()[-1])
            if mode == "send":
                assert data["reply"]["bytes"] == args.mib * MIB, data
                result["pylibp2p_MBps"] = data["MBps"]
                result["pylibp2p_cpu_bound_MBps"] = args.mib * MIB / max(data["cpu"], data["reply"]["cpu"]) / 1e6
            else:
                result["pylibp2p_rtt_us"] = data["rtt_us"]
        log(f"py-libp2p: {result['pylibp2p_MBps']:.0f} MB/s, rtt {result['pylibp2p_rtt_us']:.0f} us")
    finally:
        await finish(proc)
    return result


async def orchestrate(args) -> dict:
    result = {"mib": args.mib}
    result["raw_tcp_MBps"] = await bench_raw(args.mib)
    log(f"raw tcp: {result['raw_tcp_MBps']:.0f} MB/s")
    result.update(await bench_ours(args))
    if not args.skip_pylibp2p:
        result.update(await bench_pylibp2p(args))
        result["ours_vs_pylibp2p"] = result["ours_MBps"] / result["pylibp2p_MBps"]
        result["ours_vs_pylibp2p_cpu_bound"] = result["ours_cpu_bound_MBps"] / result["pylibp2p_cpu_bound_MBps"]
    result["load_avg_1m"] = os.getloadavg()[0]
    result["noise_cipher"] = CIPHER_NAME
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--rtt", type=int, default=2000)
    parser.add_argument("--skip-pylibp2p", action="store_true")
    parser.add_argument("--serve", choices=["raw", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.serve == "raw":
        asyncio.run(serve_raw(args.mib * MIB))
    elif args.serve == "ours":
        asyncio.run(serve_ours())
    else:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                          for k, v in asyncio.run(orchestrate(args)).items()}))


if __name__ == "__main__":
    main()

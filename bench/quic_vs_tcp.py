"""QUIC vs TCP (noise + yamux) between two Hosts in one process on loopback: bulk throughput of
one stream and the median 1 KiB echo round trip, same machine, same run (ADR 0222).

Prints one JSON object: tcp_MBps, quic_MBps (MB = 10^6 bytes, wall clock, sender and receiver
share one event loop), tcp_rtt_us, quic_rtt_us.
Usage: python bench/quic_vs_tcp.py [--mib 64] [--rtt 500]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.identity import Identity  # noqa: E402
from node.p2p.host import Host  # noqa: E402

SINK = "/bench/sink/1"
ECHO = "/bench/echo/1"
CHUNK = 1 << 20


async def sink(stream) -> None:
    total = 0
    while data := await stream.read():
        total += len(data)
    await stream.write(str(total).encode())
    await stream.close()


async def echo(stream) -> None:
    while data := await stream.read():
        await stream.write(data)
    await stream.close()


async def measure(listen: str, mib: int, rtts: int) -> tuple[float, float]:
    a, b = Host(Identity.generate(), [listen]), Host(Identity.generate(), [listen])
    b.set_handler(SINK, sink)
    b.set_handler(ECHO, echo)
    await a.start()
    await b.start()
    try:
        await a.connect(b.listen_addrs[0])
        stream = await a.open_stream(b.peer_id, SINK)
        payload = os.urandom(CHUNK)
        start = time.perf_counter()
        for _ in range(mib):
            await stream.write(payload)
        await stream.close()
        reply = await stream.read()
        elapsed = time.perf_counter() - start
        assert int(reply) == mib * CHUNK, reply
        stream = await a.open_stream(b.peer_id, ECHO)
        small = os.urandom(1024)
        samples = []
        for _ in range(rtts):
            t0 = time.perf_counter()
            await stream.write(small)
            await stream.readexactly(len(small))
            samples.append(time.perf_counter() - t0)
        await stream.close()
        return mib * CHUNK / elapsed / 1e6, statistics.median(samples) * 1e6
    finally:
        await a.stop()
        await b.stop()


async def main(mib: int, rtts: int) -> dict[str, float]:
    tcp_mbps, tcp_rtt = await measure("/ip4/127.0.0.1/tcp/0", mib, rtts)
    quic_mbps, quic_rtt = await measure("/ip4/127.0.0.1/udp/0/quic-v1", mib, rtts)
    return {"tcp_MBps": round(tcp_mbps, 1), "quic_MBps": round(quic_mbps, 1),
            "tcp_rtt_us": round(tcp_rtt), "quic_rtt_us": round(quic_rtt)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rtt", type=int, default=500)
    args = parser.parse_args()
    print(json.dumps(uvloop.run(main(args.mib, args.rtt))))

"""A py-libp2p 0.8.1 (trio) peer driven by the interop tests and bench/transport.py.

Run as a subprocess; it prints one line ``ADDR <multiaddr>`` once listening, then JSON results.
Modes:
  listen                      serve echo/sink/ping/identify until stdin closes
  dial MADDR ECHO_MIB         dial us: identify, ping, echo ECHO_MIB MiB (sha256 checked); print JSON
  send MADDR MIB              send MIB MiB on the sink protocol (1 MiB writes); print JSON with
                              MBps and the CPU seconds of both sides
  rtt MADDR COUNT             COUNT 1 KiB echo round trips; print JSON with the median in us
With PYLIBP2P_TRANSPORT=quic it listens (and so dials) on /udp/0/quic-v1 instead of TCP.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import time

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.host.ping import PingService
from libp2p.peer.peerinfo import info_from_p2p_addr

ECHO = TProtocol("/dekube/echo/1.0.0")
SINK = TProtocol("/dekube/sink/1.0.0")
CHUNK = 1 << 20


async def read_some(stream) -> bytes:
    try:
        return await stream.read(CHUNK)
    except Exception as exc:  # py-libp2p signals EOF with StreamEOF/StreamClosed
        if type(exc).__name__ in ("StreamEOF", "StreamClosed"):
            return b""
        raise


async def echo_handler(stream) -> None:
    while True:
        data = await read_some(stream)
        if not data:
            break
        await stream.write(data)
    await stream.close_write()


async def sink_handler(stream) -> None:
    total = 0
    cpu_start = time.process_time()
    while True:
        data = await read_some(stream)
        if not data:
            break
        total += len(data)
    cpu = time.process_time() - cpu_start
    await stream.write(json.dumps({"bytes": total, "cpu": cpu}).encode())
    await stream.close_write()


def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


async def echo_round(stream, mib: int) -> dict:
    payload = os.urandom(CHUNK)
    sent = hashlib.sha256()
    got = hashlib.sha256()
    received = 0

    async def reader():
        nonlocal received
        while received < mib * CHUNK:
            data = await read_some(stream)
            if not data:
                break
            received += len(data)
            got.update(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        for _ in range(mib):
            sent.update(payload)
            await stream.write(payload)
    await stream.close_write()
    return {"echo_bytes": received, "echo_ok": received == mib * CHUNK and sent.digest() == got.digest()}


async def run(mode: str, args: list[str]) -> None:
    quic = os.environ.get("PYLIBP2P_TRANSPORT") == "quic"
    listen = "/ip4/127.0.0.1/udp/0/quic-v1" if quic else "/ip4/127.0.0.1/tcp/0"
    host = new_host(key_pair=create_new_key_pair(), listen_addrs=[multiaddr.Multiaddr(listen)],
                    enable_quic=quic)
    host.set_stream_handler(ECHO, echo_handler)
    host.set_stream_handler(SINK, sink_handler)
    async with host.run(listen_addrs=[multiaddr.Multiaddr(listen)]):
        addr = next(str(a) for a in host.get_addrs() if ("/quic-v1" if quic else "/tcp/") in str(a))
        if "/p2p/" not in addr:
            addr = f"{addr}/p2p/{host.get_id()}"
        print(f"ADDR {addr}", flush=True)
        if mode == "listen":
            await trio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin
            return
        info = info_from_p2p_addr(multiaddr.Multiaddr(args[0]))
        await host.connect(info)
        if mode == "dial":
            result = {"connected": str(info.peer_id)}
            rtts = await PingService(host).ping(info.peer_id, ping_amt=3)
            result["ping_rtts"] = rtts
            for _ in range(50):  # identify runs in the background after connect
                protocols = host.get_peerstore().get_protocols(info.peer_id)
                if protocols:
                    break
                await trio.sleep(0.1)
            result["protocols"] = sorted(protocols)
            stream = await host.new_stream(info.peer_id, [ECHO])
            result.update(await echo_round(stream, int(args[1])))
            emit(result)
        elif mode == "send":
            mib = int(args[1])
            stream = await host.new_stream(info.peer_id, [SINK])
            payload = bytes(CHUNK)
            start = time.perf_counter()
            cpu_start = time.process_time()
            for _ in range(mib):
                await stream.write(payload)
            await stream.close_write()
            reply = b""
            while True:
                data = await read_some(stream)
                if not data:
                    break
                reply += data
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu_start
            emit({"MBps": mib * CHUNK / elapsed / 1e6, "cpu": cpu, "reply": json.loads(reply)})
        elif mode == "rtt":
            stream = await host.new_stream(info.peer_id, [ECHO])
            payload = os.urandom(1024)
            samples = []
            for _ in range(int(args[1])):
                start = time.perf_counter()
                await stream.write(payload)
                got = b""
                while len(got) < len(payload):
                    got += await read_some(stream)
                samples.append(time.perf_counter() - start)
            emit({"rtt_us": statistics.median(samples) * 1e6})
        await host.disconnect(info.peer_id)


if __name__ == "__main__":
    trio.run(run, sys.argv[1], sys.argv[2:])

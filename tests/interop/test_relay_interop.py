"""Circuit relay v2 interop with py-libp2p 0.8.1 (trio subprocesses, relay_pylibp2p_peer.py).

1. A py-libp2p peer reserves on our relay and another py-libp2p peer reaches it through that relay
   (echo checked by SHA-256).
2. Our client works through a py-libp2p relay: our B reserves on it, our A dials B through it and
   moves data intact (py-libp2p's relay runs with a large data cap; its ``data=0`` means no bytes).
"""
import asyncio
import json
import subprocess
import sys
from pathlib import Path

from node.identity import Identity
from node.p2p.host import Host
from relay.client import RelayClient
from relay.service import Admission, RelayService
from tests.relay.relay_harness import SINK_PROTOCOL, Sink, expected_answer, pattern, send_and_check

PEER_SCRIPT = Path(__file__).with_name("relay_pylibp2p_peer.py")
MIB = 1 << 20


async def spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(PEER_SCRIPT), *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


async def read_line(proc, prefix: bytes, timeout: float = 60) -> list[str]:
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        if not line:
            raise AssertionError(f"subprocess exited before printing {prefix!r}")
        if line.startswith(prefix):
            return line.decode().split()[1:]


async def stop(proc) -> None:
    if proc.returncode is None:
        proc.kill()
    await proc.wait()


def test_pylibp2p_peers_meet_through_our_relay():
    async def main():
        host = Host(Identity.generate())
        await host.start()
        relay = RelayService(host, Admission(stake_of=lambda peer: 1))  # everyone "registered"
        relay.start()
        procs = []
        try:
            target = await spawn("target", host.listen_addrs[0])
            procs.append(target)
            await read_line(target, b"ADDR ")
            ok, circuit_addr = await read_line(target, b"RESERVED ")
            assert ok == "True" and len(relay.reservations) == 1
            dialer = await spawn("dial", circuit_addr, "8")
            procs.append(dialer)
            await read_line(dialer, b"ADDR ")
            line = await asyncio.wait_for(dialer.stdout.readline(), 120)
            result = json.loads(line)
            assert result["echo_ok"] and result["echo_bytes"] == 8 * MIB
            assert relay.counters["circuits_refused"] == 0
            assert await dialer.wait() == 0
            await stop(target)
            for _ in range(100):  # the circuit ends once both py-libp2p peers are gone
                if relay.counters["circuits_closed"]:
                    break
                await asyncio.sleep(0.05)
            assert relay.counters["bytes_closed_circuits"] >= 16 * MIB  # the echo went through our relay
        finally:
            for proc in procs:
                await stop(proc)
            await relay.stop()
            await host.stop()
    asyncio.run(asyncio.wait_for(main(), 180))


def test_our_client_through_pylibp2p_relay():
    async def main():
        proc = await spawn("relay")
        a, b = RelayClient(Host(Identity.generate())), RelayClient(Host(Identity.generate()))
        for client in (a, b):
            await client.host.start()
            client.start()
        try:
            [relay_addr] = await read_line(proc, b"ADDR ")
            rsvp = await b.reserve(relay_addr)
            assert rsvp.expire > 0
            b.host.set_handler(SINK_PROTOCOL, Sink())
            conn = await a.dial([f"{relay_addr}/p2p-circuit/p2p/{b.host.peer_id}"])
            assert conn.remote_peer == b.host.peer_id
            data = pattern(8 * MIB)
            assert await send_and_check(conn, data) == expected_answer(data)
        finally:
            await stop(proc)
            for client in (a, b):
                await client.host.stop()
    asyncio.run(asyncio.wait_for(main(), 180))

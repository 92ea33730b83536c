"""Interop with py-libp2p 0.8.1 (the reference oracle), run as a trio subprocess.

Both directions: it dials us and we dial it; identify and ping each way; 64 MiB through an echo
protocol, checked by SHA-256. The subprocess is killed on any failure.
"""
import asyncio
import hashlib
import json
import os

from node.identity import Identity
from node.p2p.host import Host
from tests.interop.pylibp2p_process import read_addr, spawn, stop
from tests.p2p.host_kit import echo_handler

ECHO = "/dekube/echo/1.0.0"
MIB = 1 << 20
ECHO_MIB = 64


def test_pylibp2p_dials_us():
    async def main():
        host = Host(Identity.generate())
        host.set_handler(ECHO, echo_handler)
        await host.start()
        proc = await spawn("dial", host.listen_addrs[0], str(ECHO_MIB))
        try:
            peer_addr = await read_addr(proc)
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            result = json.loads(line)
            assert result["connected"] == host.peer_id
            assert len(result["ping_rtts"]) == 3
            assert {ECHO, "/ipfs/id/1.0.0", "/ipfs/ping/1.0.0"} <= set(result["protocols"])  # from our identify
            assert result["echo_bytes"] == ECHO_MIB * MIB and result["echo_ok"]
            remote = peer_addr.rsplit("/p2p/", 1)[1]
            for _ in range(50):  # our identify of the dialer runs in the background
                record = host.peerbook.get(remote)
                if record and record.protocols:
                    break
                await asyncio.sleep(0.1)
            assert record.agent_version.startswith("py-libp2p")
            assert "/ipfs/ping/1.0.0" in record.protocols
            assert str(record.addrs[0]) in peer_addr
            assert await proc.wait() == 0
        finally:
            await stop(proc)
            await host.stop()

    asyncio.run(main())


def test_we_dial_pylibp2p():
    async def main():
        host = Host(Identity.generate())
        await host.start()
        proc = await spawn("listen")
        try:
            addr = await read_addr(proc)
            peer = await host.connect(addr)
            assert peer == addr.rsplit("/p2p/", 1)[1]
            rtt = await host.ping(peer)
            assert 0 < rtt < 5
            for _ in range(50):
                record = host.peerbook.get(peer)
                if record and record.protocols:
                    break
                await asyncio.sleep(0.1)
            assert ECHO in record.protocols and record.agent_version.startswith("py-libp2p")
            assert record.observed_addr is not None  # how it sees us

            stream = await host.open_stream(peer, ECHO)
            payload = os.urandom(MIB)
            received = hashlib.sha256()

            async def reader():
                total = 0
                while True:
                    data = await stream.read()
                    if not data:
                        return total
                    total += len(data)
                    received.update(data)

            task = asyncio.create_task(reader())
            sent = hashlib.sha256()
            for _ in range(ECHO_MIB):
                sent.update(payload)
                await stream.write(payload)
            await stream.close()
            assert await asyncio.wait_for(task, 120) == ECHO_MIB * MIB
            assert received.digest() == sent.digest()
        finally:
            proc.stdin.close()
            await stop(proc)
            await host.stop()

    asyncio.run(main())

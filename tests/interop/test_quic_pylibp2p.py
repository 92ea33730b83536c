"""QUIC (/quic-v1) interop with py-libp2p 0.8.1 (the reference oracle; its QUIC transport is aioquic
with its own libp2p TLS code), run as a trio subprocess: it dials us (identify, ping, 8 MiB echo
checked by SHA-256) and we dial it (identify, ping, echo). The subprocess is killed on any failure.
"""
import asyncio
import hashlib
import json
import os

import pytest

from node.identity import Identity
from node.p2p.host import Host
from tests.interop.pylibp2p_process import read_addr, spawn, stop
from tests.p2p.host_kit import echo_handler

pytest.importorskip("libp2p.transport.quic.transport", reason="py-libp2p without its QUIC transport")

ECHO = "/dekube/echo/1.0.0"
MIB = 1 << 20
ECHO_MIB = 8
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"


async def identified(host: Host, peer: str):
    for _ in range(50):  # identify runs in the background
        record = host.peerbook.get(peer)
        if record and record.protocols:
            return record
        await asyncio.sleep(0.1)
    raise AssertionError("no identify from the py-libp2p peer")


def test_pylibp2p_dials_us_over_quic():
    async def main():
        host = Host(Identity.generate(), [QUIC])
        host.set_handler(ECHO, echo_handler)
        await host.start()
        proc = await spawn("dial", host.listen_addrs[0], str(ECHO_MIB), transport="quic")
        try:
            peer_addr = await read_addr(proc, b"/quic-v1/")
            result = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
            assert result["connected"] == host.peer_id
            assert len(result["ping_rtts"]) == 3
            assert {ECHO, "/ipfs/id/1.0.0", "/ipfs/ping/1.0.0"} <= set(result["protocols"])
            assert result["echo_bytes"] == ECHO_MIB * MIB and result["echo_ok"]
            remote = peer_addr.rsplit("/p2p/", 1)[1]
            record = await identified(host, remote)
            assert record.agent_version.startswith("py-libp2p")
            conn = host.connections(remote)[0]
            assert conn.quic and conn.direction == "inbound"
            assert await proc.wait() == 0
        finally:
            await stop(proc)
            await host.stop()

    asyncio.run(main())


def test_we_dial_pylibp2p_over_quic():
    async def main():
        host = Host(Identity.generate(), [QUIC])
        await host.start()
        proc = await spawn("listen", transport="quic")
        try:
            addr = await read_addr(proc, b"/quic-v1/")
            peer = await host.connect(addr)
            assert peer == addr.rsplit("/p2p/", 1)[1]
            assert host.connections(peer)[0].quic
            assert 0 < await host.ping(peer) < 5
            record = await identified(host, peer)
            assert ECHO in record.protocols and record.agent_version.startswith("py-libp2p")
            # py-libp2p 0.8.1 reports what it observed as /tcp/ even on a QUIC connection: only the IP
            assert record.observed_addr is not None and str(record.observed_addr).startswith("/ip4/127.0.0.1/")

            # lock-step echo: py-libp2p 0.8.1's QUIC stream drops bytes past its own 1 MiB receive
            # buffer instead of holding back flow-control credit, so a stream we fill faster than its
            # echo handler drains loses data on its side (seen with 8 MiB sent at once)
            stream = await host.open_stream(peer, ECHO)
            sent, received, total = hashlib.sha256(), hashlib.sha256(), 0
            for _ in range(ECHO_MIB * 4):
                payload = os.urandom(MIB // 4)
                sent.update(payload)
                await stream.write(payload)
                got = await asyncio.wait_for(stream.readexactly(len(payload)), 30)
                received.update(got)
                total += len(got)
            await stream.close()
            assert await asyncio.wait_for(stream.read(), 30) == b""
            assert total == ECHO_MIB * MIB and received.digest() == sent.digest()
        finally:
            proc.stdin.close()
            await stop(proc)
            await host.stop()

    asyncio.run(main())

"""SecureConn over loopback TCP: handshake, large transfers, EOF, back-pressure, timeouts."""
import asyncio
import os

import pytest

from node.identity import Identity
from node.p2p.errors import HandshakeTimeout
from node.p2p.noise import PeerIdMismatch
from node.p2p.secure_conn import TcpConnection, secure_connection

ALICE = Identity.from_seed(b"\x0c" * 32)
BOB = Identity.from_seed(b"\x0d" * 32)


async def tcp_pair() -> tuple[TcpConnection, TcpConnection, asyncio.AbstractServer]:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future = loop.create_future()

    def factory():
        tcp = TcpConnection()
        accepted.set_result(tcp)
        return tcp

    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await loop.create_connection(TcpConnection, "127.0.0.1", port)
    return client, await accepted, server


async def secure_pair(expected=None):
    client, server_tcp, server = await tcp_pair()
    a, b = await asyncio.gather(secure_connection(client, ALICE, True, expected or BOB.peer_id),
                                secure_connection(server_tcp, BOB, False))
    return a, b, server


def test_transfer_and_eof():
    async def main():
        a, b, server = await secure_pair()
        assert (a.remote_peer, b.remote_peer) == (BOB.peer_id, ALICE.peer_id)
        data = os.urandom(3 * 1024 * 1024 + 17)
        got = bytearray()

        async def reader():
            while True:
                chunk = await b.read()
                if not chunk:
                    return
                got.extend(chunk)

        task = asyncio.create_task(reader())
        await a.write(data[:100])
        await a.write(data[100:])
        await a.close()
        await asyncio.wait_for(task, 20)
        assert got == data
        await b.close()
        server.close()
    asyncio.run(main())


def test_slow_reader_blocks_writer():
    async def main():
        a, b, server = await secure_pair()
        blob = bytes(4 * 1024 * 1024)
        written = 0

        async def writer():
            nonlocal written
            for _ in range(16):
                await a.write(blob)
                written += len(blob)

        task = asyncio.create_task(writer())
        await asyncio.sleep(1.0)
        assert not task.done() and written < 16 * len(blob)  # nobody reads: the writer waits
        received = 0
        while received < 16 * len(blob):
            received += len(await b.read())
        await asyncio.wait_for(task, 20)
        await a.close()
        await b.close()
        server.close()
    asyncio.run(main())


def test_wrong_peer_and_handshake_timeout():
    async def main():
        client, server_tcp, server = await tcp_pair()
        with pytest.raises(PeerIdMismatch):
            await asyncio.gather(secure_connection(client, ALICE, True, Identity.generate().peer_id),
                                 secure_connection(server_tcp, BOB, False))
        client.abort()
        server_tcp.abort()
        client, server_tcp, server2 = await tcp_pair()
        with pytest.raises(HandshakeTimeout):
            await secure_connection(server_tcp, BOB, False, timeout=0.3)  # the client never speaks
        client.abort()
        server.close()
        server2.close()
    asyncio.run(main())

"""The Host's public hooks for relayed connections: a registered circuit dialer serves
``connect``/``open_stream``/``open_bulk_connection`` for ``/p2p-circuit`` addresses, the peer book
keeps them and tries them after direct ones, and a dialer that returns the wrong thing is refused.
Last, the real relay client plugged in as the dialer reaches a peer through a relay."""
import asyncio

import pytest

from node.identity import Identity
from node.p2p.host import DialError, Host
from node.p2p.multiaddr import Multiaddr
from node.p2p.secure_conn import TcpConnection
from tests.p2p.host_kit import echo_handler

ECHO = "/test/echo/1"
DEAD_TCP = "/ip4/127.0.0.1/tcp/1"  # nothing listens on port 1


class PipeDialer:
    """Stands in for a relay: 'dials' a circuit by making a loopback TCP pipe to ``target`` and
    upgrading both ends with ``Host.upgrade``, as the relay client does with circuit streams."""

    def __init__(self, source: Host, target: Host) -> None:
        self.source, self.target = source, target
        self.calls: list[tuple[str, bool]] = []
        self.made = []  # the connections it returned

    async def __call__(self, maddr: Multiaddr, bulk: bool):
        self.calls.append((str(maddr), bulk))
        loop = asyncio.get_running_loop()
        accepted = loop.create_future()

        def factory():
            tcp = TcpConnection()
            accepted.set_result(tcp)
            return tcp

        server = await loop.create_server(factory, "127.0.0.1", 0)
        try:
            _, pipe = await loop.create_connection(TcpConnection, "127.0.0.1", server.sockets[0].getsockname()[1])
            far_end = await accepted
            conn, _ = await asyncio.gather(
                self.source.upgrade(pipe, is_initiator=True, expected_peer=maddr.peer_id, bulk=bulk),
                self.target.upgrade(far_end, is_initiator=False))
        finally:
            server.close()
        self.made.append(conn)
        return conn


def run(body):
    async def main():
        a, b = Host(Identity.generate()), Host(Identity.generate())
        b.set_handler(ECHO, echo_handler)
        await a.start()
        await b.start()
        try:
            await asyncio.wait_for(body(a, b), 30)
        finally:
            await a.stop()
            await b.stop()
    asyncio.run(main())


def circuit_addr(relay: Host | None, target: Host) -> str:
    relay_id = relay.peer_id if relay else Identity.generate().peer_id
    return f"/ip4/127.0.0.1/tcp/4001/p2p/{relay_id}/p2p-circuit/p2p/{target.peer_id}"


def test_connect_to_a_circuit_address_uses_the_registered_dialer():
    async def body(a, _b):
        b = Host(Identity.generate(), listen_addrs=())  # reachable only through "circuits"
        b.set_handler(ECHO, echo_handler)
        await b.start()
        try:
            maddr = circuit_addr(None, b)
            with pytest.raises(DialError, match="no circuit dialer"):
                await a.connect(maddr)
            dialer = PipeDialer(a, b)
            a.register_circuit_dialer(dialer)
            assert await a.connect(maddr) == b.peer_id
            assert dialer.calls == [(maddr, False)]
            stream = await a.open_stream(b.peer_id, ECHO)
            await stream.write(b"through the circuit")
            assert await stream.readexactly(19) == b"through the circuit"
            assert a.is_connected(b.peer_id) and len(dialer.calls) == 1  # the shared connection is reused
            bulk = await a.open_bulk_connection(b.peer_id)
            assert bulk.bulk and dialer.calls[-1] == (maddr, True)
            assert dialer.made == [stream.connection, bulk]
        finally:
            await b.stop()
    run(body)


def test_peer_book_tries_direct_addresses_before_circuits():
    async def body(a, b):
        dialer = PipeDialer(a, b)
        a.register_circuit_dialer(dialer)
        maddr = circuit_addr(None, b)
        # the circuit is stored first, yet the direct address is dialed first and wins
        a.peerbook.add_addrs(b.peer_id, [maddr, b.listen_addrs[0]])
        assert any(addr.is_relayed for addr in a.peerbook.addrs(b.peer_id))
        stream = await a.open_stream(b.peer_id, ECHO)
        assert dialer.calls == []
        assert stream.connection.remote_addr == Multiaddr.parse(b.listen_addrs[0]).without_peer_id()
        await stream.connection.close()
        # with only a dead direct address left, the circuit is the fallback
        a.peerbook = type(a.peerbook)()
        a.peerbook.add_addrs(b.peer_id, [maddr, DEAD_TCP])
        stream = await a.open_stream(b.peer_id, ECHO)
        assert dialer.calls == [(maddr, False)] and dialer.made == [stream.connection]
    run(body)


def test_a_dialer_returning_the_wrong_peer_or_failing_is_a_dial_error():
    async def body(a, b):
        other = Host(Identity.generate())
        await other.start()
        try:

            async def wrong_peer(maddr, bulk):  # reaches `other` whatever was asked
                return await PipeDialer(a, other)(Multiaddr.parse(circuit_addr(None, other)), bulk)

            a.register_circuit_dialer(wrong_peer)
            with pytest.raises(DialError, match="reached"):
                await a.connect(circuit_addr(None, b))
            assert not a.connections(b.peer_id)

            async def refused(maddr, bulk):
                raise ConnectionRefusedError("relay said no")

            a.register_circuit_dialer(refused)
            with pytest.raises(DialError, match="relay said no"):
                await a.connect(circuit_addr(None, b))
            a.register_circuit_dialer(None)
            with pytest.raises(DialError, match="no circuit dialer"):
                await a.connect(circuit_addr(None, b))
        finally:
            await other.stop()
    run(body)


def test_relay_client_as_the_circuit_dialer():
    from relay.client import RelayClient
    from relay.service import Admission, RelayService

    async def main():
        relay_host = Host(Identity.generate())
        await relay_host.start()
        clients = []
        for listen in (["/ip4/127.0.0.1/tcp/0"], []):  # b listens nowhere, like a peer behind NAT
            host = Host(Identity.generate(), listen)
            await host.start()
            client = RelayClient(host)
            client.start()
            clients.append(client)
        a, b = clients
        service = RelayService(relay_host, Admission({a.host.peer_id, b.host.peer_id}))
        service.start()
        try:
            await b.reserve(relay_host.listen_addrs[0])
            b.host.set_handler(ECHO, echo_handler)
            a.host.register_circuit_dialer(lambda maddr, bulk: a.dial([str(maddr)], bulk=bulk))
            assert await a.host.connect(b.relayed_addrs[0]) == b.host.peer_id
            stream = await a.host.open_stream(b.host.peer_id, ECHO)
            assert a.pipe_for(stream.connection) is not None  # relayed, not direct
            await stream.write(b"via relay")
            assert await stream.readexactly(9) == b"via relay"
            bulk = await a.host.open_bulk_connection(b.host.peer_id)
            assert bulk.bulk and a.pipe_for(bulk) is not None and bulk is not stream.connection
        finally:
            await service.stop()
            for host in (a.host, b.host, relay_host):
                await host.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_identify_advertises_extra_relayed_addresses():
    relay = Identity.generate().peer_id

    async def main():
        async with Host(Identity.generate()) as a, Host(Identity.generate()) as b:
            circuit = f"/ip4/127.0.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{b.peer_id}"
            b.advertise_extra_addrs(lambda: [circuit, "not a multiaddr"])
            await a.connect(b.listen_addrs[0])
            for _ in range(250):
                if any(addr.is_relayed for addr in a.peerbook.addrs(b.peer_id)):
                    break
                await asyncio.sleep(0.02)
            addrs = [str(addr) for addr in a.peerbook.addrs(b.peer_id)]
            assert addrs[0] + f"/p2p/{b.peer_id}" == b.listen_addrs[0]
            assert circuit.rsplit(f"/p2p/{b.peer_id}", 1)[0] in addrs  # the junk one is left out
    asyncio.run(main())

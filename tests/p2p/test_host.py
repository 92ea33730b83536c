"""Host-to-Host over loopback: upgrade, streams, identify, ping, dedupe, bulk connections,
limits, handshake timeout, and a garbage-sending client that is dropped while another peer
keeps being served."""
import asyncio
import os
import socket

import pytest

from node.identity import Identity
from node.p2p.errors import ProtocolError
from node.p2p.host import DialError, Host
from node.p2p.limits import HostLimits
from node.p2p.multiaddr import Multiaddr
from node.p2p.multistream import NoCommonProtocol
from node.p2p.negotiate import select_protocol
from node.p2p.secure_conn import TcpConnection, secure_connection
from tests.p2p.host_kit import echo_handler, until

ECHO = "/test/echo/1"


def run(coro_fn, **host_kwargs):
    async def main():
        a = Host(Identity.generate(), **host_kwargs)
        b = Host(Identity.generate(), **host_kwargs)
        b.set_handler(ECHO, echo_handler)
        await a.start()
        await b.start()
        try:
            await asyncio.wait_for(coro_fn(a, b), 30)
        finally:
            await a.stop()
            await b.stop()
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not leftover, leftover
    asyncio.run(main())


def test_connect_stream_identify_ping():
    async def body(a, b):
        assert b.listen_addrs[0].endswith("/p2p/" + b.peer_id)
        assert await a.connect(b.listen_addrs[0]) == b.peer_id
        stream = await a.open_stream(b.peer_id, ["/nope/1", ECHO])
        assert stream.protocol == ECHO and stream.remote_peer == b.peer_id
        payload = os.urandom(300_000)
        await stream.write(payload)
        assert await stream.readexactly(len(payload)) == payload
        await stream.close()
        assert await stream.read() == b""
        assert 0 < await a.ping(b.peer_id) < 1
        await until(lambda: (a.peerbook.get(b.peer_id) or None) and a.peerbook.get(b.peer_id).protocols
                    and b.peerbook.get(a.peer_id) and b.peerbook.get(a.peer_id).protocols)
        record = a.peerbook.get(b.peer_id)
        assert ECHO in record.protocols and record.agent_version == "dekube/0.1.0"
        assert str(record.addrs[0]) + f"/p2p/{b.peer_id}" == b.listen_addrs[0]
        assert b.peerbook.get(a.peer_id).observed_addr is not None
    run(body)


def test_open_stream_dials_from_peerbook_and_dedupes():
    async def body(a, b):
        a.peerbook.add_addrs(b.peer_id, b.listen_addrs)
        streams = await asyncio.gather(*(a.open_stream(b.peer_id, ECHO) for _ in range(10)))
        assert len(a.connections(b.peer_id)) == 1
        for s in streams:
            await s.write(b"x")
            assert await s.readexactly(1) == b"x"
        await a.connect(b.listen_addrs[0])
        assert len(a.connections(b.peer_id)) == 1
        port = b.listen_addrs[0].split("/")[4]
        async with Host(Identity.generate()) as c:
            assert await c.connect(f"/dns4/localhost/tcp/{port}/p2p/{b.peer_id}") == b.peer_id
            assert c.connections(b.peer_id)[0].remote_addr.value_of("ip4") == "127.0.0.1"
    run(body)


def test_bulk_connection_is_dedicated():
    async def body(a, b):
        await a.connect(b.listen_addrs[0])
        shared = a.connections(b.peer_id)[0]
        bulk = await a.open_bulk_connection(b.peer_id)
        assert bulk is not shared and bulk.bulk and len(a.connections(b.peer_id)) == 2
        stream = await bulk.open_stream(ECHO)
        await stream.write(b"bulk")
        assert await stream.readexactly(4) == b"bulk"
        other = await a.open_stream(b.peer_id, ECHO)
        assert other.connection is shared
        await bulk.close()
        await until(lambda: len(a.connections(b.peer_id)) == 1)
        assert a.is_connected(b.peer_id)
    run(body)


def test_bulk_dial_skips_a_shared_address_the_peer_does_not_listen_on():
    """After a hole punch the shared connection's remote address is a NAT mapping reachable only
    from the punch port: bulk dials must use the peer's listen addresses instead."""
    async def body(a, b):
        await a.connect(b.listen_addrs[0])
        shared = a.connections(b.peer_id)[0]
        with socket.socket() as s:  # a local port nobody listens on stands in for the mapping
            s.bind(("127.0.0.1", 0))
            shared.remote_addr = Multiaddr.from_tcp("127.0.0.1", s.getsockname()[1])
        tried = []
        real_dial = a._dial

        async def spy(peer_id, addrs, bulk):
            tried.extend(addrs)
            return await real_dial(peer_id, addrs, bulk)

        a._dial = spy
        bulk = await a.open_bulk_connection(b.peer_id)
        assert bulk.bulk and shared.remote_addr not in tried
        assert tried[0] == Multiaddr.parse(b.listen_addrs[0]).without_peer_id()
        await bulk.close()
    run(body)


def test_wrong_peer_id_and_unknown_protocol():
    async def body(a, b):
        impostor = Identity.generate().peer_id
        wrong = b.listen_addrs[0].rsplit("/p2p/", 1)[0] + "/p2p/" + impostor
        with pytest.raises(DialError, match="PeerIdMismatch"):
            await a.connect(wrong)
        await a.connect(b.listen_addrs[0])
        with pytest.raises(NoCommonProtocol):
            await a.open_stream(b.peer_id, "/unknown/1")
        stream = await a.open_stream(b.peer_id, ECHO)  # the connection survives
        await stream.write(b"ok")
        assert await stream.readexactly(2) == b"ok"
    run(body)


def test_failing_handler_resets_only_its_stream():
    async def body(a, b):
        async def broken(stream):
            raise RuntimeError("handler bug")
        b.set_handler("/broken/1", broken)
        await a.connect(b.listen_addrs[0])
        with pytest.raises(ConnectionError):  # the reset may even overtake the negotiation reply
            stream = await a.open_stream(b.peer_id, "/broken/1")
            await stream.readexactly(1)
        assert a.is_connected(b.peer_id)
        assert 0 < await a.ping(b.peer_id)
    run(body)


def test_garbage_client_dropped_while_other_peer_served():
    async def body(a, b):
        await a.connect(b.listen_addrs[0])
        stream = await a.open_stream(b.peer_id, ECHO)
        host, port = b.listen_addrs[0].split("/")[2], int(b.listen_addrs[0].split("/")[4])
        garbage = [b"\x13/multistream/1.0.0\n\x07/noise\n" + os.urandom(5000), os.urandom(3000),
                   b"\xff" * 64, b"\x13/multistream/1.0.0\n\x07/noise\n\x00\x20" + b"\x00" * 32]
        for junk in garbage:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(junk)
            await writer.drain()
            await stream.write(b"ping")
            assert await stream.readexactly(4) == b"ping"
            rest = await asyncio.wait_for(reader.read(), 5)  # the node closes on us
            assert len(rest) < 1000
            writer.close()
        assert len(b.connections()) == 1
        assert 0 < await a.ping(b.peer_id)
    run(body, limits=HostLimits(handshake_timeout=1.0))


def test_handshake_timeout_and_connection_limits():
    async def body(a, b):
        host, port = b.listen_addrs[0].split("/")[2], int(b.listen_addrs[0].split("/")[4])
        reader, writer = await asyncio.open_connection(host, port)
        assert await asyncio.wait_for(reader.read(), 5) == b"\x13/multistream/1.0.0\n"  # then dropped
        writer.close()
        await a.connect(b.listen_addrs[0])
        await a.open_bulk_connection(b.peer_id)
        with pytest.raises(DialError, match="limit"):
            await a.open_bulk_connection(b.peer_id)
    run(body, limits=HostLimits(handshake_timeout=0.5, max_connections_per_peer=2))


def test_remote_stop_forgets_connection_and_redials():
    async def main():
        a, b = Host(Identity.generate()), Host(Identity.from_seed(b"\x05" * 32))
        b.set_handler(ECHO, echo_handler)
        await a.start()
        await b.start()
        addr = b.listen_addrs[0]
        await a.connect(addr)
        await b.stop()
        await until(lambda: not a.is_connected(b.peer_id))
        b2 = Host(Identity.from_seed(b"\x05" * 32), listen_addrs=[addr.rsplit("/p2p/", 1)[0]])
        b2.set_handler(ECHO, echo_handler)
        await b2.start()
        stream = await a.open_stream(b2.peer_id, ECHO)  # redials from the peer book
        await stream.write(b"again")
        assert await stream.readexactly(5) == b"again"
        await a.stop()
        await b2.stop()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_authenticated_peer_sending_junk_is_dropped_alone():
    """Past the handshake: a bad noise frame, and junk inside valid noise frames (bad yamux)."""
    async def body(a, b):
        await a.connect(b.listen_addrs[0])
        stream = await a.open_stream(b.peer_id, ECHO)
        host, port = b.listen_addrs[0].split("/")[2], int(b.listen_addrs[0].split("/")[4])
        loop = asyncio.get_running_loop()
        for mode in ("bad-mac", "bad-yamux"):
            _, tcp = await loop.create_connection(TcpConnection, host, port)

            async def raw_write(data, tcp=tcp):
                tcp.write(data)

            await select_protocol(tcp.read, raw_write, tcp.unread, ["/noise"], 5)
            mallory = Identity.generate()
            secure = await secure_connection(tcp, mallory, True, b.peer_id)
            await select_protocol(secure.read, secure.write, secure.unread, ["/yamux/1.0.0"], 5)
            await until(lambda mallory=mallory: mallory.peer_id in {c.remote_peer for c in b.connections()})
            if mode == "bad-mac":
                tcp.write(b"\x00\x40" + os.urandom(64))
            else:
                await secure.write(b"\x07" + os.urandom(200))  # yamux version 7: protocol error
            await until(lambda mallory=mallory: mallory.peer_id not in {c.remote_peer for c in b.connections()})
            await until(lambda tcp=tcp: tcp.is_closed)
            await stream.write(b"still")
            assert await stream.readexactly(5) == b"still"
        assert [c.remote_peer for c in b.connections()] == [a.peer_id]
    run(body)


def test_dial_errors_are_clear():
    async def body(a, b):
        stranger = Identity.generate().peer_id
        with pytest.raises(DialError, match="no known address"):
            await a.open_stream(stranger, ECHO)
        a.peerbook.add_addrs(stranger, ["/ip4/127.0.0.1/tcp/1"])  # nothing listens there
        with pytest.raises(DialError, match="ConnectionRefused"):
            await a.open_stream(stranger, ECHO)
        with pytest.raises(DialError, match="ourselves"):
            await a.connect(a.listen_addrs[0])
        with pytest.raises(ValueError):
            await a.connect("/ip4/127.0.0.1/tcp/1")  # no /p2p suffix
        with pytest.raises(ValueError):
            a.peerbook.add_addrs(stranger, [b.listen_addrs[0]])  # an address of another peer
    run(body)


def test_wildcard_listen_addresses_are_advertised_as_the_reached_ip():
    from node.p2p.host import advertised_addrs
    from node.p2p.multiaddr import Multiaddr
    bound = [Multiaddr.parse(a) for a in ("/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001", "/ip4/10.1.2.3/tcp/5")]
    assert [str(a) for a in advertised_addrs(bound, "192.168.1.7")] == ["/ip4/192.168.1.7/tcp/4001",
                                                                        "/ip4/10.1.2.3/tcp/5"]
    assert [str(a) for a in advertised_addrs(bound, "fe80::1")] == ["/ip6/fe80::1/tcp/4001", "/ip4/10.1.2.3/tcp/5"]
    assert [str(a) for a in advertised_addrs(bound, None)] == ["/ip4/10.1.2.3/tcp/5"]


def test_upgrade_over_a_foreign_pipe():
    """Host.upgrade secures any TcpConnection-shaped pipe (the relay client's circuits)."""
    async def body(a, b):
        loop = asyncio.get_running_loop()
        accepted = loop.create_future()

        # a plain TCP pair stands in for a circuit: a dials, b accepts, both through upgrade()
        def factory():
            tcp = TcpConnection()
            accepted.set_result(tcp)
            return tcp

        server = await loop.create_server(factory, "127.0.0.1", 0)
        _, pipe_a = await loop.create_connection(TcpConnection, "127.0.0.1", server.sockets[0].getsockname()[1])
        pipe_b = await accepted
        conn_a, conn_b = await asyncio.gather(a.upgrade(pipe_a, is_initiator=True, expected_peer=b.peer_id),
                                              b.upgrade(pipe_b, is_initiator=False))
        assert conn_a.remote_peer == b.peer_id and conn_b.remote_peer == a.peer_id
        stream = await a.open_stream(b.peer_id, ECHO)
        assert stream.connection is conn_a
        await stream.write(b"relayed")
        assert await stream.readexactly(7) == b"relayed"
        _, bad_pipe = await loop.create_connection(TcpConnection, "127.0.0.1", int(b.listen_addrs[0].split("/")[4]))
        with pytest.raises(ProtocolError):
            await a.upgrade(bad_pipe, is_initiator=True, expected_peer=Identity.generate().peer_id)
        assert bad_pipe.is_closed or bad_pipe.transport.is_closing()
        server.close()
    run(body)


def test_stop_during_pending_upgrades_leaves_no_sockets():
    async def main():
        host = Host(Identity.generate(), limits=HostLimits(handshake_timeout=30))
        await host.start()
        port = int(host.listen_addrs[0].split("/")[4])
        clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]  # never speak
        await until(lambda: len(host._upgrading) == 5)
        await host.stop()
        for reader, writer in clients:
            try:  # aborted: EOF or reset, after at most our multistream header
                data = await asyncio.wait_for(reader.read(), 5)
            except ConnectionResetError:
                data = b""
            assert data in (b"", b"\x13/multistream/1.0.0\n")
            writer.close()
        assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    asyncio.run(main())


def test_inbound_connection_limit_refuses_when_all_protected():
    async def main():
        server = Host(Identity.generate(), limits=HostLimits(max_inbound_connections=1))
        first, second = Host(Identity.generate()), Host(Identity.generate())
        for h in (server, first, second):
            await h.start()
        server.protect(first.peer_id, "test")  # unprotected, it would be evicted for second
        try:
            await first.connect(server.listen_addrs[0])
            await until(lambda: len(server.connections()) == 1)
            with pytest.raises(DialError):
                await second.connect(server.listen_addrs[0])
            assert [c.remote_peer for c in server.connections()] == [first.peer_id]
            assert 0 < await first.ping(server.peer_id)
        finally:
            for h in (server, first, second):
                await h.stop()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_open_stream_redials_after_goaway():
    async def body(a, b):
        await a.connect(b.listen_addrs[0])
        old = a.connections(b.peer_id)[0]
        for conn in b.connections(a.peer_id):
            await conn.muxed.close()  # GoAway: no new streams on that connection
        await until(lambda: old.muxed.closed or old.closed)
        stream = await a.open_stream(b.peer_id, ECHO)
        assert stream.connection is not old
        await stream.write(b"new")
        assert await stream.readexactly(3) == b"new"
    run(body)

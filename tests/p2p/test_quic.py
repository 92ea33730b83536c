"""Host-to-Host over QUIC (/quic-v1) on loopback: handshake and peer IDs both ways, a wrong
expected peer refused, echo/identify/ping over QUIC streams, many concurrent streams past the
initial MAX_STREAMS credit, a bulk transfer with back-pressure, a peer going away, TCP and QUIC
on one host, and a listener that shrugs off junk datagrams, certificate-less clients and a flood
of handshakes that never finish."""
import asyncio
import datetime
import hashlib
import os
import socket
import ssl

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from node.identity import Identity
from node.p2p.host import DialError, Host
from node.p2p.limits import HostLimits
from node.p2p.multiaddr import Multiaddr
from node.p2p.quic_transport import ALPN, MAX_STREAM_DATA, QuicEndpoint, QuicSession, QuicTls
from node.p2p.tls_cert import CertificateError
from tests.p2p.host_kit import echo_handler, until

ECHO = "/test/echo/1"
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"
TCP = "/ip4/127.0.0.1/tcp/0"


def quic_addr(host: Host) -> str:
    return next(a for a in host.listen_addrs if "/quic-v1/" in a)


def run(body, addrs=(QUIC,), **host_kwargs):
    async def main():
        a = Host(Identity.generate(), list(addrs), **host_kwargs)
        b = Host(Identity.generate(), list(addrs), **host_kwargs)
        b.set_handler(ECHO, echo_handler)
        await a.start()
        await b.start()
        try:
            await asyncio.wait_for(body(a, b), 60)
        finally:
            await a.stop()
            await b.stop()
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not leftover, leftover
    asyncio.run(main())


async def echo_once(stream, payload: bytes) -> bytes:
    await stream.write(payload)
    await stream.close()
    out = b""
    while data := await stream.read():
        out += data
    return out


def test_quic_handshake_echo_identify_ping():
    async def body(a, b):
        addr = quic_addr(b)
        assert addr.startswith("/ip4/127.0.0.1/udp/") and addr.endswith("/quic-v1/p2p/" + b.peer_id)
        assert await a.connect(addr) == b.peer_id
        stream = await a.open_stream(b.peer_id, ["/nope/1", ECHO])
        assert stream.protocol == ECHO
        assert await echo_once(stream, b"hello over quic") == b"hello over quic"
        conn = stream.connection
        assert conn.quic and str(conn.remote_addr) == addr.rsplit("/p2p/", 1)[0]
        assert 0 < await a.ping(b.peer_id) < 1
        assert 0 < await conn.ping() < 1   # a QUIC PING frame round trip
        # the listener authenticated the dialer's certificate: its peer ID, from a's listening port
        await until(lambda: b.connections(a.peer_id))
        inbound = b.connections(a.peer_id)[0]
        assert inbound.direction == "inbound" and inbound.quic
        assert str(inbound.remote_addr) == quic_addr(a).rsplit("/p2p/", 1)[0]
        # identify ran over a QUIC stream and filled the peer book with the QUIC listen address
        await until(lambda: (r := a.peerbook.get(b.peer_id)) is not None and ECHO in r.protocols)
        assert addr.rsplit("/p2p/", 1)[0] in [str(x) for x in a.peerbook.addrs(b.peer_id)]
    run(body)


def test_quic_over_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this environment")
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("::1 cannot be bound here")

    async def body(a, b):
        addr = quic_addr(b)
        assert addr.startswith("/ip6/::1/udp/")
        await a.connect(addr)
        stream = await a.open_stream(b.peer_id, ECHO)
        assert await echo_once(stream, b"six") == b"six"
        assert str(stream.connection.remote_addr).startswith("/ip6/::1/udp/")
    run(body, addrs=("/ip6/::1/udp/0/quic-v1",))


def test_wrong_expected_peer_refused():
    async def body(a, b):
        impostor = Identity.generate().peer_id
        wrong = quic_addr(b).rsplit("/p2p/", 1)[0] + "/p2p/" + impostor
        with pytest.raises(DialError, match="reached " + b.peer_id):
            await a.connect(wrong)
        assert not a.connections()
        await until(lambda: not b.connections())   # a closed it: b keeps nothing either
    run(body)


def test_endpoint_refuses_wrong_peer_with_certificate_error():
    async def main():
        server_id, client_id = Identity.generate(), Identity.generate()
        accepted = []
        server = await QuicEndpoint.open("127.0.0.1", 0, QuicTls(server_id), accepted.append)
        client = await QuicEndpoint.open("127.0.0.1", 0, QuicTls(client_id))
        try:
            with pytest.raises(CertificateError, match="reached " + server_id.peer_id):
                await client.dial(server.sockname, client_id.peer_id, 5)
            session = await client.dial(server.sockname, server_id.peer_id, 5)
            assert session.remote_peer == server_id.peer_id
            await until(lambda: any(not s.closed for s in accepted))
            # the refused dial closed before its Finished: the listener accepted at most a dead session
            assert [s.closed for s in accepted] in ([False], [True, False])
            assert {s.remote_peer for s in accepted} == {client_id.peer_id}
        finally:
            await client.close()
            await server.close()
    asyncio.run(main())


def test_many_concurrent_streams():
    """300 streams at once: past aioquic's initial credit of 128, so opening waits for MAX_STREAMS."""
    async def body(a, b):
        await a.connect(quic_addr(b))

        async def one(i):
            stream = await a.open_stream(b.peer_id, ECHO)
            payload = os.urandom(100) + i.to_bytes(4, "big")
            assert await echo_once(stream, payload) == payload

        await asyncio.gather(*(one(i) for i in range(300)))
        assert len(a.connections(b.peer_id)) == 1
        await until(lambda: a.connections(b.peer_id)[0].num_streams == 0)
    run(body)


def test_bulk_transfer_with_back_pressure():
    async def body(a, b):
        received = hashlib.sha256()
        done = asyncio.Event()
        total = 0

        async def sink(stream):
            nonlocal total
            while data := await stream.read():
                total += len(data)
                received.update(data)
                await asyncio.sleep(0)   # a slow-ish reader
            await stream.close()
            done.set()

        b.set_handler("/test/sink/1", sink)
        await a.connect(quic_addr(b))
        stream = await a.open_stream(b.peer_id, "/test/sink/1")
        sent = hashlib.sha256()
        chunk = os.urandom(256 * 1024)
        for _ in range(32):   # 8 MiB
            sent.update(chunk)
            await stream.write(chunk)
            # write() returned: no more than about a window in flight, not the whole transfer queued
            session = stream.connection.muxed
            assert session._unacked(stream._stream.stream_id) <= (1 << 20) + len(chunk)
        await stream.close()
        await asyncio.wait_for(done.wait(), 30)
        assert total == 32 * len(chunk) and received.digest() == sent.digest()
    run(body)


def test_receive_buffer_bounded_by_the_window():
    """A handler that never reads: the sender's writes block once a window is in flight, and the
    receiver holds at most MAX_STREAM_DATA for the stream (aioquic alone would keep doubling it)."""
    async def body(a, b):
        held = []
        release = asyncio.Event()

        async def hoard(stream):
            held.append(stream)
            await release.wait()
            while await stream.read():
                pass

        b.set_handler("/test/hoard/1", hoard)
        await a.connect(quic_addr(b))
        stream = await a.open_stream(b.peer_id, "/test/hoard/1")
        chunk = bytes(256 * 1024)
        written = 0

        async def writer():
            nonlocal written
            for _ in range(64):   # 16 MiB, four times the window
                await stream.write(chunk)
                written += len(chunk)
            await stream.close()

        task = asyncio.create_task(writer())
        await until(lambda: held)
        last = -1
        for _ in range(30):   # until the writer stalls (or finishes, which it must not)
            await asyncio.sleep(0.5)
            if task.done() or written == last:
                break
            last = written
        buffered = len(held[0]._stream._buffer)
        assert not task.done() and written < 64 * len(chunk)   # blocked, not queued in memory
        assert 0 < buffered <= MAX_STREAM_DATA
        release.set()   # reading moves the window on: the rest flows
        await asyncio.wait_for(task, 30)
        assert written == 64 * len(chunk)
    run(body)


def test_graceful_close_lets_open_streams_finish():
    """close(drain_timeout=...) (what retiring a connection calls on its muxer) waits for streams."""
    async def body(a, b):
        await a.connect(quic_addr(b))
        stream = await a.open_stream(b.peer_id, ECHO)
        session = stream.connection.muxed
        closing = asyncio.create_task(session.close(drain_timeout=5))
        await asyncio.sleep(0.2)
        assert not closing.done() and not session.closed
        assert await echo_once(stream, b"last words") == b"last words"
        await asyncio.wait_for(closing, 5)
        assert session.closed
        started = asyncio.get_running_loop().time()
        await a.connect(quic_addr(b))
        stuck = await a.open_stream(b.peer_id, ECHO)
        await stuck.connection.muxed.close(drain_timeout=0.3)   # a stream that never ends
        assert asyncio.get_running_loop().time() - started < 3 and stuck.connection.closed
    run(body)


def test_peer_stopping_closes_the_connection():
    async def body(a, b):
        await a.connect(quic_addr(b))
        stream = await a.open_stream(b.peer_id, ECHO)
        await stream.write(b"x")
        assert await stream.read() == b"x"
        await b.stop()
        # b sent CONNECTION_CLOSE: a sees it at once, its stream fails, the peer is disconnected
        await until(lambda: not a.is_connected(b.peer_id))
        with pytest.raises(ConnectionError):
            await stream.read()
        # redialing a dead UDP port: no answer within connect_timeout fails it, as a TCP connect would
        started = asyncio.get_running_loop().time()
        with pytest.raises(DialError, match="no QUIC answer"):
            await a.open_stream(b.peer_id, ECHO)
        assert asyncio.get_running_loop().time() - started < 2
    run(body, limits=HostLimits(connect_timeout=0.5))


def test_tcp_and_quic_on_one_host():
    async def body(a, b):
        c = Host(Identity.generate(), [TCP])
        await c.start()
        try:
            await a.connect(quic_addr(b))
            tcp_addr = next(x for x in b.listen_addrs if "/tcp/" in x)
            await c.connect(tcp_addr)
            for host in (a, c):
                stream = await host.open_stream(b.peer_id, ECHO)
                assert await echo_once(stream, b"both") == b"both"
            assert a.connections(b.peer_id)[0].quic and not c.connections(b.peer_id)[0].quic
            assert {conn.quic for conn in b.connections()} == {True, False}
        finally:
            await c.stop()
    run(body, addrs=(TCP, QUIC))


def test_open_stream_from_peerbook_uses_quic():
    """No connect(): open_stream dials the peer's known QUIC address from the peer book."""
    async def body(a, b):
        a.peerbook.add_addrs(b.peer_id, [Multiaddr.parse(quic_addr(b)).without_peer_id()])
        stream = await a.open_stream(b.peer_id, ECHO)
        assert stream.connection.quic
        assert await echo_once(stream, b"book") == b"book"
    run(body)


def test_peerbook_dials_prefer_tcp_and_fall_back_to_quic():
    """Both known (QUIC listed first): open_stream takes TCP; with TCP gone, QUIC carries it."""
    async def body(a, b):
        tcp = Multiaddr.parse(next(x for x in b.listen_addrs if "/tcp/" in x)).without_peer_id()
        quic = Multiaddr.parse(quic_addr(b)).without_peer_id()
        a.peerbook.add_addrs(b.peer_id, [quic, tcp])
        assert a.peerbook.addrs(b.peer_id)[0] == quic
        stream = await a.open_stream(b.peer_id, ECHO)
        assert not stream.connection.quic
        assert await echo_once(stream, b"tcp") == b"tcp"
        await stream.connection.close()
        b._servers[0].close()   # TCP stops accepting: the race falls through to QUIC
        await until(lambda: not a.is_connected(b.peer_id))
        stream = await a.open_stream(b.peer_id, ECHO)
        assert stream.connection.quic
        assert await echo_once(stream, b"quic") == b"quic"
    run(body, addrs=(TCP, QUIC))


def test_junk_datagrams_and_plain_tls_clients_are_ignored():
    async def body(a, b):
        host, port = quic_addr(b).split("/")[2], int(quic_addr(b).split("/")[4])
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for size in (0, 1, 20, 1199, 1200, 1500):
                sock.sendto(os.urandom(size), (host, port))
            sock.sendto(b"\xc0\x00\x00\x00\x01" + os.urandom(1300), (host, port))  # long header, junk
        finally:
            sock.close()
        # a client with an ordinary certificate (no libp2p extension) is refused by the listener
        tls = QuicTls(Identity.generate())
        plain = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([])
        now = datetime.datetime.now(datetime.UTC)
        plain.certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                             .public_key(key.public_key()).serial_number(1)
                             .not_valid_before(now - datetime.timedelta(hours=1))
                             .not_valid_after(now + datetime.timedelta(hours=1)).sign(key, hashes.SHA256()))
        plain.private_key = key
        client = await QuicEndpoint.open("127.0.0.1", 0, tls)
        try:
            quic = QuicConnection(configuration=plain)
            session = QuicSession(client, quic, (host, port), is_initiator=True, expected_peer=None)
            client._add(session, [quic.host_cid])
            session.connect()
            await until(lambda: session.closed, 10)   # the listener closed it after verifying
        finally:
            await client.close()
        assert not b.connections()
        # and b still serves an honest peer
        await a.connect(quic_addr(b))
        stream = await a.open_stream(b.peer_id, ECHO)
        assert await echo_once(stream, b"still here") == b"still here"
    run(body)


def test_unfinished_handshakes_are_capped_and_expire():
    """Initials that never complete take at most max_pending slots, each freed after the timeout."""
    limits = HostLimits(max_pending_inbound=4, inbound_handshake_timeout=0.5)

    async def body(a, b):
        host, port = quic_addr(b).split("/")[2], int(quic_addr(b).split("/")[4])
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        listener = b._quic_listeners[0]
        try:
            for _ in range(10):  # ten fresh clients sending their first flight only
                quic = QuicConnection(configuration=QuicTls(Identity.generate()).configuration(is_client=True))
                quic.connect((host, port), now=0.0)
                for data, _addr in quic.datagrams_to_send(now=0.0):
                    sock.sendto(data, (host, port))
            await until(lambda: listener.num_sessions == 4)
            await asyncio.sleep(0.3)
            assert listener.num_sessions == 4      # the other six were dropped
            await until(lambda: listener.num_sessions == 0, 5)
        finally:
            sock.close()
        await a.connect(quic_addr(b))   # slots free again: an honest dialer gets in
        await until(lambda: b.connections(a.peer_id))
    run(body, limits=limits)


def test_quic_addresses_in_ledger_records_and_autonat():
    """A host listening on QUIC too: its addresses go into ledger records (wildcards left out as
    for TCP), AutoNAT asks for TCP dial-backs only, an observed QUIC address gives the IP, port
    mapping skips the QUIC listener (each of these raised MultiaddrError on a QUIC address before)."""
    from node.ledger.record import dialable
    from relay.portmap.service import listen_port
    from relay.reachability import candidate_addrs

    async def body(a, b):
        quic = quic_addr(b).rsplit("/p2p/", 1)[0]
        assert dialable([quic, "/ip4/0.0.0.0/udp/1/quic-v1", "/ip4/1.2.3.4/tcp/1"]) == [quic, "/ip4/1.2.3.4/tcp/1"]
        observed = Multiaddr.parse("/ip4/5.6.7.8/udp/999/quic-v1")
        out = [str(x) for x in candidate_addrs(b, observed)]
        tcp_port = next(x for x in b.listen_addrs if "/tcp/" in x).split("/")[4]
        assert out == [f"/ip4/127.0.0.1/tcp/{tcp_port}", f"/ip4/5.6.7.8/tcp/{tcp_port}"]
        # port mapping asks for the TCP listener's port, past a QUIC listener listed first
        assert listen_port(["/ip4/10.0.0.2/udp/4001/quic-v1", "/ip4/10.0.0.2/tcp/4002"]) == 4002
    run(body, addrs=(TCP, QUIC))

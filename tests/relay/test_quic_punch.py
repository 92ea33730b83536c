"""DCUtR over QUIC on loopback (ADR 0228): QUIC observed addresses in CONNECT, the spec's roles (the
responder dials QUIC, the initiator opens its NAT with random datagrams and accepts), a relayed pair
ending on a direct QUIC connection with and without the TCP punch beside it, and the bounded
NAT-opening datagrams."""
import asyncio
import socket
import time

from ledger_testnet import eventually as wait_until
from ledger_testnet import node_config
from relay_harness import SINK_PROTOCOL, Sink, expected_answer, pattern, send_and_check, stop_all
from test_relay_node_punch import ECHO, echo, is_relayed, round_trip

from node.identity import Identity
from node.p2p.host import Host
from node.p2p.multiaddr import Multiaddr
from node.roles import basic_role
from node.runtime import Node
from relay.client import RelayClient
from relay.dcutr import DcutrInitiator, Dial
from relay.holepunch import HolePuncher
from relay.quic_punch import MAX_PACKETS, RANDOM_BYTES, SPRAY_INTERVAL_S
from relay.service import Admission, RelayService

LISTEN = ("/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1")


def quic_addr(host: Host) -> str:
    return next(a for a in host.listen_addrs if "/quic-v1" in a)


async def relayed_pair(tcp: bool = True):
    hosts = [Host(Identity.generate(), LISTEN) for _ in range(2)]
    for host in hosts:
        await host.start()
    a, b = (RelayClient(host) for host in hosts)
    for client in (a, b):
        client.start()
    relay_host = Host(Identity.generate(), LISTEN)
    await relay_host.start()
    relay = RelayService(relay_host, Admission({a.host.peer_id, b.host.peer_id}))
    relay.start()
    relay_tcp = relay_host.listen_addrs[0]
    punchers = []
    for client in (a, b):
        puncher = HolePuncher(client.host, punch_window=3.0, ipv6=False, tcp=tcp)
        puncher.start()
        await puncher.connect_public(relay_tcp)
        observed = await puncher.connect_public(quic_addr(relay_host))
        assert observed == Multiaddr.parse(quic_addr(client.host).split("/p2p/")[0])
        punchers.append(puncher)
    await b.reserve(relay_tcp)
    relayed = await a.dial(b.relayed_addrs)
    return a, b, relay, relayed, punchers


def test_connect_offers_the_quic_mapping_a_relay_observed():
    async def main():
        a, b, relay, relayed, (pa, pb) = await relayed_pair()
        try:
            offer, _random = await pa.offer()
            assert Multiaddr.parse(f"/ip4/127.0.0.1/tcp/{pa.port}") in offer
            quic = [addr for addr in offer if addr.is_quic]
            assert quic == [pa.quic.observed[relay.host.peer_id]]
            assert set(DcutrInitiator(offer).own_addrs) == set(offer)   # dialable keeps QUIC ones now
            quic_conn = next(c for c in a.host.connections(relay.host.peer_id) if c.quic)
            await quic_conn.close()
            assert not [addr for addr in pa.own_addrs() if addr.is_quic]   # no live connection: not offered
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_relayed_pair_ends_on_a_direct_quic_connection():
    """TCP punching off: the only way through is QUIC. B (the DCUtR responder) is the QUIC client,
    A (the initiator) the server; both sides record the same direct QUIC connection, which carries
    the protocols the relayed one did."""
    async def main():
        a, b, relay, relayed, (pa, pb) = await relayed_pair(tcp=False)
        sink = Sink()
        b.host.set_handler(SINK_PROTOCOL, sink)
        try:
            assert a.pipe_for(relayed) is not None
            direct = await pa.direct_connect(relayed)
            assert direct is not None and direct.quic and a.pipe_for(direct) is None
            assert direct.remote_peer == b.host.peer_id and direct.direction == "inbound"
            assert direct.remote_addr == pb.quic.observed[relay.host.peer_id]
            theirs = await pb.wait_direct(a.host.peer_id, 5)
            assert theirs is not None and theirs.quic and theirs.direction == "outbound"
            data = pattern(2 << 20)
            assert await send_and_check(direct, data) == expected_answer(data)
            assert await direct.ping() >= 0
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_tcp_and_quic_punch_together_and_a_quic_only_peer_is_still_reached():
    """Both punches run at once; with B offering only its QUIC mapping (no TCP one observed) the TCP
    punch has nothing to dial and the QUIC one gets through."""
    async def main():
        a, b, relay, relayed, (pa, pb) = await relayed_pair()
        try:
            pb.observed.clear()
            assert pb.own_addrs() and all(addr.is_quic for addr in pb.own_addrs())
            direct = await pa.direct_connect(relayed)
            assert direct is not None and direct.quic and direct.remote_peer == b.host.peer_id
        finally:
            await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_nat_opening_datagrams_are_random_bounded_and_stop_at_the_deadline():
    """The server side of a QUIC punch toward an address where no QUIC answers: 64-byte random
    datagrams 10-200 ms apart, never more than MAX_PACKETS, then a clear TimeoutError."""
    async def main():
        host = Host(Identity.generate(), LISTEN)
        await host.start()
        sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sink.bind(("127.0.0.1", 0))
        sink.setblocking(False)
        target = Multiaddr.from_quic("127.0.0.1", sink.getsockname()[1])
        puncher = HolePuncher(host)
        try:
            started = time.monotonic()
            try:
                await puncher.quic.accept([target], Identity.generate().peer_id, started + 1.0)
            except TimeoutError as exc:
                assert "no QUIC connection" in str(exc)
            else:
                raise AssertionError("accept returned without a peer")
            assert time.monotonic() - started < 3.0   # stopped at its deadline (1 s), not later
            packets = []
            while True:
                try:
                    packets.append(sink.recv(2048))
                except BlockingIOError:
                    break
            assert 1.0 / SPRAY_INTERVAL_S[1] <= len(packets) <= min(MAX_PACKETS, 1.0 / SPRAY_INTERVAL_S[0] + 1)
            assert all(len(p) == RANDOM_BYTES for p in packets) and len(set(packets)) == len(packets)
            assert puncher.quic.packets_sent == len(packets)
        finally:
            sink.close()
            await host.stop()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_two_nodes_learn_their_quic_mapping_from_the_relay_and_end_on_direct_quic():
    """Nodes configured with a relay's TCP address and a QUIC listener connect to the relay over
    QUIC too (its QUIC address from identify), so a stream opened by relayed address ends on a
    punched QUIC connection when TCP punching is off, and the relayed connection is retired."""
    async def main():
        ids = [Identity.generate() for _ in range(2)]
        relay_host = Host(Identity.generate(), LISTEN)
        await relay_host.start()
        relay = RelayService(relay_host, Admission({i.peer_id for i in ids}))
        relay.start()
        nodes, tasks = [], []
        try:
            for identity in ids:
                config = node_config(relays=[relay_host.listen_addrs[0]], reserve=True, rpc=False, hole_punch=True,
                                     extra={("p2p", "listen"): list(LISTEN)})
                node = Node(config, identity, [basic_role("compute")])
                node.relay_client.ledger = None
                tasks.append(asyncio.create_task(node.run()))
                await asyncio.wait_for(node.ready.wait(), 10)
                node.host.set_handler(ECHO, echo)
                node.relay_client.punching.puncher.tcp = False
                nodes.append(node)
            a, b = nodes
            await wait_until(lambda: all(n.relay_client.client.relayed_addrs
                                         and n.relay_client.punching.puncher.quic.own_addrs() for n in nodes),
                             what="reservations and QUIC mappings")
            a.host.peerbook.add_addrs(b.peer_id, b.relay_client.client.relayed_addrs)  # only B's relayed address
            conn = await round_trip(a, b.peer_id)
            assert conn.quic and not is_relayed(conn)
            assert a.relay_client.punching.punched == 1
            await wait_until(lambda: not any(is_relayed(c) and not c.closed for c in a.host.connections(b.peer_id)),
                             what="relayed connection retired")
            assert (await round_trip(a, b.peer_id)).quic
        finally:
            for node, task in zip(nodes, tasks):
                node.request_stop()
                await asyncio.wait_for(task, 10)
            await stop_all(relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_tcp_upgrade_under_way_finishes_when_the_quic_punch_wins():
    """QUIC wins while the punched TCP socket is being secured: the upgrade is not aborted (the peer
    may already have taken that TCP connection; aborting it would close the one it chose)."""
    async def main():
        host = Host(Identity.generate(), LISTEN)
        puncher = HolePuncher(host, ipv6=False)
        peer = Identity.generate().peer_id
        securing, release = asyncio.Event(), asyncio.Event()
        upgraded = []

        class Conn:
            remote_peer = peer

        async def punch(addrs, birthday, speaker=True):
            return object()

        async def upgrade(tcp, **_kwargs):
            securing.set()
            await release.wait()
            upgraded.append(Conn())
            return upgraded[-1]

        async def quic_accept(addrs, peer_id, deadline):
            await securing.wait()
            return "quic"
        puncher._punch = punch
        host.upgrade = upgrade
        puncher.quic.accept = quic_accept
        dial = Dial((Multiaddr.parse("/ip4/10.0.0.1/tcp/4001"), Multiaddr.parse("/ip4/10.0.0.1/udp/4001/quic-v1")),
                    0.0, 0.0)
        assert await puncher._punch_direct(dial, peer, initiator=True, own_random=False) == "quic"
        release.set()
        for _ in range(50):
            if upgraded:
                break
            await asyncio.sleep(0.01)
        assert len(upgraded) == 1 and not puncher._upgrades
    asyncio.run(asyncio.wait_for(main(), 10))

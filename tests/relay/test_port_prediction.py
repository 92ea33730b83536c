"""Port prediction for sequential symmetric NATs (ADR 0204): the pure parts, and on loopback the
offer a punch makes when the relay saw the punch port rewritten (a fresh probe's next ports)."""
import asyncio

from relay_harness import start_endpoint, start_relay, stop_all

from node.p2p.multiaddr import Multiaddr
from relay.holepunch import HolePuncher
from relay.port_prediction import predicted_addrs, rewrites_ports


def test_next_ports_are_predicted_and_bounded():
    fresh = Multiaddr.parse("/ip4/203.0.113.7/tcp/20005")
    assert [a.tcp_endpoint()[1] for a in predicted_addrs(fresh, 3)] == [20006, 20007, 20008]
    assert predicted_addrs(Multiaddr.parse("/ip4/203.0.113.7/tcp/65534"), 3) == [
        Multiaddr.parse("/ip4/203.0.113.7/tcp/65535")]
    assert rewrites_ports(fresh, 4001) and not rewrites_ports(fresh, 20005)


def test_a_rewritten_punch_port_offers_the_next_ports_or_asks_for_birthday_probing(monkeypatch):
    """Two fresh probes a port apart: a sequential NAT, its next ports are offered; further apart: a
    random NAT, flagged for birthday probing; a kept port: neither (no probe at all)."""
    import relay.holepunch as holepunch

    async def main():
        a = await start_endpoint()
        relay = await start_relay({a.host.peer_id})
        puncher = HolePuncher(a.host, ipv6=False)
        puncher.start()
        try:
            observed = await puncher.connect_public(relay.host.listen_addrs[0])
            probes = []

            async def no_probe(host, addr):
                probes.append(addr)
                return None

            monkeypatch.setattr(holepunch, "fresh_mapping", no_probe)
            assert await puncher.offer() == ([observed], False)  # the port was kept: nothing predicted
            assert probes == []
            rewritten = Multiaddr.parse("/ip4/127.0.0.1/tcp/9")  # as a symmetric NAT's mapping looks
            puncher.observed = {relay.host.peer_id: rewritten}
            for ports, random_ports in (([20004, 20005], False), ([20004, 41771], True)):
                seen = iter(ports)

                async def probe(host, addr, seen=seen):
                    return Multiaddr.parse(f"/ip4/127.0.0.1/tcp/{next(seen)}")

                monkeypatch.setattr(holepunch, "fresh_mapping", probe)
                offer, flagged = await puncher.offer()
                assert flagged == random_ports and offer[0] == rewritten
                expected = [] if random_ports else list(range(20006, 20006 + puncher.predict))
                assert [addr.tcp_endpoint()[1] for addr in offer[1:]] == expected
            puncher.predict = 0
            assert await puncher.offer() == ([rewritten], False)
        finally:
            await stop_all(a, relay)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_real_probe_reads_the_mapping_of_a_new_connection():
    from relay.port_prediction import fresh_mapping

    async def main():
        a = await start_endpoint()
        relay = await start_relay({a.host.peer_id})
        try:
            seen = await fresh_mapping(a.host, Multiaddr.parse(relay.host.listen_addrs[0]))
            assert seen is not None and seen.tcp_endpoint()[0] == "127.0.0.1"
            assert not [c for c in a.host.connections(relay.host.peer_id) if not c.closed]  # closed after
        finally:
            await stop_all(a, relay)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_birthday_dials_only_when_exactly_one_side_is_random():
    import random

    from relay.birthday import PROBE_PORTS, SPRAY_SOCKETS, birthday_dials

    addrs = (Multiaddr.parse("/ip4/203.0.113.7/tcp/4001"),)
    for own, peer, count in ((False, False, 0), (True, True, 0), (True, False, SPRAY_SOCKETS),
                             (False, True, PROBE_PORTS)):
        dials = birthday_dials(addrs, 5000, own_random=own, peer_random=peer, deadline=0.0,
                               rng=random.Random(1))
        assert len(dials) == count
        for dial in dials:
            dial.close()


def test_the_random_ports_flag_travels_in_dekube_field_3_and_is_absent_by_default():
    from relay.dcutr import HolePunch, HolePunchType, decode_holepunch, encode_holepunch

    addr = Multiaddr.parse("/ip4/203.0.113.7/tcp/4001")
    plain = encode_holepunch(HolePunch(HolePunchType.CONNECT, (addr,)))
    flagged = encode_holepunch(HolePunch(HolePunchType.CONNECT, (addr,), random_ports=True))
    assert flagged == bytes([plain[0] + 2]) + plain[1:] + b"\x18\x01"  # the spec bytes, then field 3
    assert decode_holepunch(flagged[1:]).random_ports and not decode_holepunch(plain[1:]).random_ports

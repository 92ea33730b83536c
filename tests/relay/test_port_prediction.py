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


def test_a_rewritten_punch_port_offers_the_ports_after_a_fresh_probe():
    async def main():
        a = await start_endpoint()
        relay = await start_relay({a.host.peer_id})
        puncher = HolePuncher(a.host)
        puncher.start()
        try:
            observed = await puncher.connect_public(relay.host.listen_addrs[0])
            assert await puncher.offer_addrs() == [observed]  # the port was kept: nothing predicted
            rewritten = Multiaddr.parse("/ip4/127.0.0.1/tcp/9")  # as a symmetric NAT's mapping looks
            puncher.observed = {relay.host.peer_id: rewritten}
            offer = await puncher.offer_addrs()
            assert offer[0] == rewritten and len(offer) == 1 + puncher.predict
            ports = [addr.tcp_endpoint()[1] for addr in offer[1:]]
            assert ports == list(range(ports[0], ports[0] + puncher.predict))
            probe_port = ports[0] - 1  # the probe's own (ephemeral) port, as the relay saw it
            assert probe_port not in (puncher.port, 9)
            puncher.predict = 0
            assert await puncher.offer_addrs() == [rewritten]
        finally:
            await stop_all(a, relay)
    asyncio.run(asyncio.wait_for(main(), 30))

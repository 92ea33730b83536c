"""Both sides of a hole punch take the same TCP connection when several connect at once (a random
symmetric NAT's side sprays sockets at a full cone's punch port, and the full cone's listener takes
them all): the initiator, who speaks first, keeps its first socket; the responder takes the one the
initiator's first bytes arrive on. Before, each took its own first, and when those differed the
noise handshake ran on two different connections and the punch failed (the full-cone x symmetric
pair relayed in one netlab run of three, ADR 0223's finding)."""
import asyncio

from relay_harness import start_endpoint, start_relay, stop_all

from relay import birthday
from relay.holepunch import HolePuncher

ROUNDS = 10


async def _relayed_pair():
    a, b = await start_endpoint(), await start_endpoint()
    relay = await start_relay({a.host.peer_id, b.host.peer_id})
    relay_addr = relay.host.listen_addrs[0]
    punchers = []
    for endpoint in (a, b):
        puncher = HolePuncher(endpoint.host, punch_window=2.0, ipv6=False, predict=0, attempts=1)
        puncher.start()
        await puncher.connect_public(relay_addr)
        punchers.append(puncher)
    await b.reserve(relay_addr)
    relayed = await a.dial(b.relayed_addrs)
    return a, b, relay, relayed, punchers


def said_random(offer):
    """``offer`` that says our NAT maps every flow to a random port (so this side sprays)."""
    async def random_offer():
        addrs, _ = await offer()
        return addrs, True
    return random_offer


def test_a_spraying_responder_and_the_initiator_take_the_same_connection(monkeypatch):
    """B says its NAT is random, so it sprays 256 sockets at A's punch port (and dials it from its
    punch port); on loopback all of them connect. Every single-attempt punch must end direct."""
    monkeypatch.setattr(birthday, "PROBE_PORTS", 0)   # A does not probe random loopback ports

    async def main():
        for _ in range(ROUNDS):
            a, b, relay, relayed, (pa, pb) = await _relayed_pair()
            pb.offer = said_random(pb.offer)
            try:
                direct = await pa.direct_connect(relayed)
                assert direct is not None, "the punch ended on two different connections"
                assert direct.remote_peer == b.host.peer_id and await direct.ping() >= 0
                assert (await pb.wait_direct(a.host.peer_id, 5)) is not None
            finally:
                await stop_all(a, b, relay)
    asyncio.run(asyncio.wait_for(main(), 120))

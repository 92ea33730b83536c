"""Hole punching in the node on loopback: two home Nodes with a relay configured; one opens a stream
to the other knowing only its relayed address and gets a punched, direct connection (the relayed
one retired), or stays relayed with ``[relay] hole_punch = false``; the inbound side punches on
its own when the dialer does not."""
import asyncio

from ledger_testnet import eventually, node_config
from relay_harness import start_relay, stop_all

from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node
from relay.client import RelayClient
from relay.repunch import RepunchSchedule

ECHO = "/test/echo/1.0.0"


async def echo(stream):
    data = await stream.read()
    await stream.write(data)
    await stream.close()


async def start_home(identity, relay_addr, hole_punch=True):
    node = Node(node_config(relays=[relay_addr], reserve=True, rpc=False, hole_punch=hole_punch), identity,
                [basic_role("compute")])
    node.relay_client.ledger = None
    task = asyncio.create_task(node.run())
    await asyncio.wait_for(node.ready.wait(), 10)
    node.host.set_handler(ECHO, echo)
    return node, task


async def stop_home(node, task):
    node.request_stop()
    await asyncio.wait_for(task, 10)


def is_relayed(conn) -> bool:
    return RelayClient.pipe_for(None, conn) is not None


async def home_pair(hole_punch=True):
    a_id, b_id = Identity.generate(), Identity.generate()
    relay = await start_relay({a_id.peer_id, b_id.peer_id})
    relay_addr = relay.host.listen_addrs[0]
    (a, a_task), (b, b_task) = [await start_home(i, relay_addr, hole_punch) for i in (a_id, b_id)]
    await eventually(lambda: a.relay_client.client.relayed_addrs and b.relay_client.client.relayed_addrs,
                     what="reservations")
    a.host.peerbook.add_addrs(b.peer_id, b.relay_client.client.relayed_addrs)  # only B's relayed address
    return relay, (a, a_task), (b, b_task)


async def round_trip(node, peer):
    stream = await node.host.open_stream(peer, ECHO)
    await stream.write(b"ping")
    await stream.close()
    assert await stream.read() == b"ping"
    return stream.connection


def test_open_stream_by_relayed_address_ends_up_punched():
    async def main():
        relay, (a, a_task), (b, b_task) = await home_pair()
        try:
            punching = a.relay_client.punching
            assert punching.puncher.own_addrs()  # the relay observed the punch port before the reservation
            conn = await round_trip(a, b.peer_id)
            assert not is_relayed(conn) and conn.remote_addr is not None
            assert punching.punched == 1
            await eventually(lambda: not any(is_relayed(c) and not c.closed for c in a.host.connections(b.peer_id)),
                             what="relayed connection retired")
            assert not is_relayed(await round_trip(a, b.peer_id))  # later streams take the direct one
            status = (await a.status.snapshot())["relay_client"]["hole_punch"]
            assert status["dials_punched"] == 1 and b.peer_id in status["direct_peers"]
        finally:
            await stop_home(a, a_task)
            await stop_home(b, b_task)
            await stop_all(relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_hole_punch_off_stays_relayed():
    async def main():
        relay, (a, a_task), (b, b_task) = await home_pair(hole_punch=False)
        try:
            assert a.relay_client.punching is None
            conn = await round_trip(a, b.peer_id)
            assert is_relayed(conn)
            await asyncio.sleep(0.5)
            assert is_relayed(await round_trip(a, b.peer_id))
        finally:
            await stop_home(a, a_task)
            await stop_home(b, b_task)
            await stop_all(relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_dialed_node_punches_when_the_dialer_does_not():
    """A dialer that does not punch (a plain relay dial, as a libp2p peer's) leaves it to the dialed
    node, which upgrades the inbound relayed connection itself and retires the relayed one."""
    async def main():
        relay, (a, a_task), (b, b_task) = await home_pair()
        try:
            client = a.relay_client.client
            a.host.register_circuit_dialer(lambda maddr, bulk: client.dial([str(maddr)], bulk=bulk))
            conn = await round_trip(a, b.peer_id)
            assert is_relayed(conn)
            await eventually(lambda: b.relay_client.punching.puncher.direct.get(a.peer_id) is not None,
                             what="b punched")
            await eventually(lambda: conn.closed, what="b retired the relayed connection")
            assert not is_relayed(await round_trip(a, b.peer_id))
        finally:
            await stop_home(a, a_task)
            await stop_home(b, b_task)
            await stop_all(relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_peer_left_relayed_is_punched_again_once_a_punch_can_work():
    """The first punch cannot work (neither punch port has a live mapping at a relay: nothing to offer),
    so the dial stays relayed; once the run loop has re-made those connections, the retry the
    schedule holds (relay/repunch.py) punches through and retires the relayed connection."""
    async def main():
        relay, (a, a_task), (b, b_task) = await home_pair()
        try:
            punching = a.relay_client.punching
            punching.repunch = RepunchSchedule(first_s=0.2)
            for node in (a, b):
                puncher = node.relay_client.punching.puncher
                for conn in list(puncher._public.values()):
                    await conn.close()
            assert not punching.puncher.own_addrs()
            assert is_relayed(await round_trip(a, b.peer_id))
            assert punching.relayed == 1 and b.peer_id in punching.repunch
            await eventually(lambda: punching.repunched == 1, what="a later punch", timeout=30)
            assert b.peer_id not in punching.repunch
            await eventually(lambda: not any(is_relayed(c) and not c.closed for c in a.host.connections(b.peer_id)),
                             what="relayed connection retired")
            assert not is_relayed(await round_trip(a, b.peer_id))
        finally:
            await stop_home(a, a_task)
            await stop_home(b, b_task)
            await stop_all(relay)
    asyncio.run(asyncio.wait_for(main(), 90))

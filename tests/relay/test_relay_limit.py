"""Relay limits (ADR 0143): a relay announcing js-libp2p's default cap (128 KiB, 120 s) gives a
limited circuit that carries signalling (ping, identify) but refuses bulk with an error naming the
limit; when a direct path exists, bulk goes direct."""
import asyncio

import pytest
from relay_harness import SINK_PROTOCOL, Sink, eventually, expected_answer, pattern, send_and_check

from node.identity import Identity
from node.p2p.errors import ProtocolError
from node.p2p.host import DialError, Host
from node.p2p.limited import LimitedConnectionError
from relay.client import RelayClient
from relay.messages import Limit
from relay.service import Admission, RelayLimits, RelayService

JS_DEFAULT = Limit(duration=120, data=128 << 10)


async def _bench(b_listens: bool):
    relay_host = Host(Identity.generate())
    await relay_host.start()
    clients = []
    for listen in (["/ip4/127.0.0.1/tcp/0"], ["/ip4/127.0.0.1/tcp/0"] if b_listens else []):
        host = Host(Identity.generate(), listen)
        await host.start()
        client = RelayClient(host)
        client.start()
        clients.append(client)
    a, b = clients
    service = RelayService(relay_host, Admission({a.host.peer_id, b.host.peer_id}),
                           RelayLimits(circuit_limit=JS_DEFAULT))
    service.start()
    await b.reserve(relay_host.listen_addrs[0])
    b.host.set_handler(SINK_PROTOCOL, Sink())
    a.host.register_circuit_dialer(lambda maddr, bulk: a.dial([str(maddr)], bulk=bulk))
    return service, a, b


async def _stop(service, *clients):
    await service.stop()
    await service.host.stop()
    for client in clients:
        await client.host.stop()


def test_limited_circuit_carries_signalling_and_refuses_bulk():
    async def main():
        service, a, b = await _bench(b_listens=False)
        try:
            await a.host.connect(b.relayed_addrs[0])
            [conn] = a.host.connections(b.host.peer_id)
            assert a.pipe_for(conn) is not None and conn.limited and conn.limit == JS_DEFAULT
            await eventually(lambda: len(b.host.connections(a.host.peer_id)) == 1)
            [inbound] = b.host.connections(a.host.peer_id)
            assert inbound.limited and inbound.limit == JS_DEFAULT  # from STOP CONNECT

            # signalling works over the limited circuit, both ways
            assert await a.host.ping(b.host.peer_id) >= 0
            assert await b.host.ping(a.host.peer_id) >= 0
            await eventually(lambda: any(a.host.peerbook.addrs(b.host.peer_id)))  # identify ran

            # a bulk protocol is refused on it, with the limit named
            with pytest.raises(LimitedConnectionError, match="131072|128 KiB"):
                await a.host.open_stream(b.host.peer_id, SINK_PROTOCOL)
            with pytest.raises(LimitedConnectionError, match="128 KiB"):
                await b.host.open_stream(a.host.peer_id, "/dekube/allreduce/1")
            # no direct path and no unlimited relay: the bulk connection waits for a direct one, then
            # fails naming the limit
            started = asyncio.get_running_loop().time()
            with pytest.raises(DialError, match=r"128 KiB, 120 s.*no direct connection within 15 s"):
                await a.host.open_bulk_connection(b.host.peer_id)
            assert asyncio.get_running_loop().time() - started >= 14
            assert len(a.host.connections(b.host.peer_id)) == 1  # no limited bulk circuit left behind

            # the listening side refuses bulk protocols on a limited connection too
            conn.limit = None
            with pytest.raises(ProtocolError):
                await a.host.open_stream(b.host.peer_id, SINK_PROTOCOL)
        finally:
            await _stop(service, a, b)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_bulk_goes_direct_when_a_direct_path_exists():
    async def main():
        service, a, b = await _bench(b_listens=True)
        try:
            await a.host.connect(b.relayed_addrs[0])
            [shared] = a.host.connections(b.host.peer_id)
            assert shared.limited
            # a direct address turns up (identify, ledger, or a hole punch's mapping)
            a.host.peerbook.add_addrs(b.host.peer_id, [b.host.listen_addrs[0]])
            bulk = await a.host.open_bulk_connection(b.host.peer_id)
            assert bulk.bulk and not bulk.limited and a.pipe_for(bulk) is None  # direct
            data = pattern(1 << 20)  # well past the 128 KiB the circuit would have carried
            assert await send_and_check(bulk, data) == expected_answer(data)
        finally:
            await _stop(service, a, b)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_relay_enforces_the_data_limit_it_announces():
    """A peer pair that ignores the Limit (both sides treat the circuit as unlimited) gets the
    circuit closed by the relay once a direction carried the announced 128 KiB."""
    async def main():
        service, a, b = await _bench(b_listens=False)
        try:
            await a.host.connect(b.relayed_addrs[0])
            [conn] = a.host.connections(b.host.peer_id)
            await eventually(lambda: len(b.host.connections(a.host.peer_id)) == 1)
            [inbound] = b.host.connections(a.host.peer_id)
            conn.limit = inbound.limit = None       # misbehaving endpoints: bulk over the capped circuit
            data = pattern(1 << 20)
            with pytest.raises((ConnectionError, ProtocolError, asyncio.IncompleteReadError)):
                answer = await asyncio.wait_for(send_and_check(conn, data, chunk=64 << 10), 20)
                assert answer == expected_answer(data), "no error, but the data did not all arrive"
                raise AssertionError("1 MiB crossed a circuit capped at 128 KiB")
            await eventually(lambda: not a.host.connections(b.host.peer_id))
            await eventually(lambda: not service.policy.circuits)
            assert service.policy.counters["bytes_closed_circuits"] <= 2 * JS_DEFAULT.data
        finally:
            await _stop(service, a, b)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_relay_closes_a_circuit_at_its_duration_limit():
    async def main():
        relay_host = Host(Identity.generate())
        await relay_host.start()
        a_host, b_host = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"]), Host(Identity.generate())
        for host in (a_host, b_host):
            await host.start()
        a, b = RelayClient(a_host), RelayClient(b_host)
        a.start()
        b.start()
        service = RelayService(relay_host, Admission({a_host.peer_id, b_host.peer_id}),
                               RelayLimits(circuit_limit=Limit(duration=1)))
        service.start()
        try:
            await b.reserve(relay_host.listen_addrs[0])
            a_host.register_circuit_dialer(lambda maddr, bulk: a.dial([str(maddr)], bulk=bulk))
            await a_host.connect(b.relayed_addrs[0])
            assert a_host.connections(b_host.peer_id)
            await eventually(lambda: not a_host.connections(b_host.peer_id), timeout=10)
        finally:
            await service.stop()
            for host in (relay_host, a_host, b_host):
                await host.stop()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_bulk_waits_for_a_hole_punched_connection():
    """Only a capped circuit reaches B when the bulk dial starts; a direct connection turns up a
    moment later (what a DCUtR hole punch over the circuit makes): the bulk dial waits and uses it."""
    async def main():
        service, a, b = await _bench(b_listens=False)
        try:
            await a.host.connect(b.relayed_addrs[0])
            assert all(c.limited for c in a.host.connections(b.host.peer_id))

            async def punch():
                await asyncio.sleep(1.0)
                b.host.peerbook.add_addrs(a.host.peer_id, [a.host.listen_addrs[0]])
                await b.host.open_bulk_connection(a.host.peer_id)   # B reaches A directly (connection reversal)
            puncher = asyncio.ensure_future(punch())
            bulk = await a.host.open_bulk_connection(b.host.peer_id)
            await puncher
            assert not bulk.limited and not bulk.relayed
            data = pattern(1 << 20)                           # past the circuit's 128 KiB
            assert await send_and_check(bulk, data) == expected_answer(data)
        finally:
            await _stop(service, a, b)
    asyncio.run(asyncio.wait_for(main(), 60))

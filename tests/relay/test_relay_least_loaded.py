"""Least-loaded relay choice on loopback (ADR 0227): relays report their load, new circuits and
reservations go to the relay with the least load, a reservation moves when another relay is much
less loaded, and a relay claiming no load gets no more than its share."""
import asyncio
import time

from ledger_testnet import node_config
from relay_harness import eventually, start_endpoint, start_relay, stop_all

from node.identity import Identity
from node.p2p.multiaddr import Multiaddr
from node.roles import basic_role
from node.runtime import Node
from relay import choice
from relay import client as client_module
from relay.load import LoadReport, query_load
from relay.role import fit_connection_limit
from relay.service import RelayLimits


def run(coro, timeout=60):
    asyncio.run(asyncio.wait_for(coro, timeout))


async def load_with_circuits(relay, count):
    """Open ``count`` circuits through ``relay`` between two fresh endpoints; returns them to stop."""
    src, dst = await start_endpoint(), await start_endpoint()
    relay.admission.allow_list |= {src.host.peer_id, dst.host.peer_id}
    fit_connection_limit(src.host, count)
    fit_connection_limit(dst.host, count)
    await dst.reserve(relay.host.listen_addrs[0])
    for _ in range(count):
        await src.dial(dst.relayed_addrs, bulk=True)
    return src, dst


def via(client, conn):
    return client.pipe_for(conn).relay_peer


def first_listed(addrs, relay):
    """``addrs`` with those through ``relay`` first (the order an old client would try them in)."""
    return sorted(addrs, key=lambda addr: relay.host.peer_id not in addr)


def test_relay_reports_its_load():
    async def main():
        a = await start_endpoint()
        relay = await start_relay({a.host.peer_id}, RelayLimits(max_circuits=8, max_reservations=10))
        loaders = await load_with_circuits(relay, 3)
        try:
            await a.host.connect(relay.host.listen_addrs[0])
            got = await query_load(a.host, relay.host.peer_id)
            assert got == LoadReport(circuits=3, max_circuits=8, reservations=1, max_reservations=10)
            assert got.utilization == 3 / 8
        finally:
            await stop_all(a, *loaders, relay)
    run(main())


def test_new_circuits_go_to_the_less_loaded_relay():
    """B reserves on two relays; the one A would try first (listed first) carries 6 of its 8 circuits.
    A's new circuits to B go through the other one. Fails without the load ranking (dial tries the
    addresses in the order given)."""
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        fit_connection_limit(a.host, 8)
        allow = {a.host.peer_id, b.host.peer_id}
        loaded = await start_relay(set(allow), RelayLimits(max_circuits=8))
        idle = await start_relay(set(allow), RelayLimits(max_circuits=8))
        loaders = await load_with_circuits(loaded, 6)
        try:
            for relay in (loaded, idle):
                await b.reserve(relay.host.listen_addrs[0])
            addrs = first_listed(b.relayed_addrs, loaded)
            await a.refresh_loads([r.host.listen_addrs[0] for r in (loaded, idle)])   # what A knows of them
            for _ in range(3):
                conn = await a.dial(addrs, bulk=True)
                assert via(a, conn) == idle.host.peer_id
            assert len(loaded.circuits) == 6
        finally:
            await stop_all(a, b, *loaders, loaded, idle)
    run(main())


def test_host_dials_try_the_least_loaded_relay_first():
    """The same through the Host (the relay node client registers the ranking): a bulk connection to
    B, whose peer book lists the loaded relay first, is a circuit through the idle one."""
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        allow = {a.host.peer_id, b.host.peer_id}
        loaded = await start_relay(set(allow), RelayLimits(max_circuits=4))
        idle = await start_relay(set(allow), RelayLimits(max_circuits=4))
        loaders = await load_with_circuits(loaded, 3)
        a.host.register_circuit_dialer(lambda maddr, bulk: a.dial([str(maddr)], bulk=bulk))
        a.host.register_relay_ranking(a.rank_circuit_addrs)
        try:
            for relay in (loaded, idle):
                await b.reserve(relay.host.listen_addrs[0])
            a.host.peerbook.add_addrs(b.host.peer_id, first_listed(b.relayed_addrs, loaded))
            # the first ranking asks the relays in the background; the next dial knows their loads
            a.rank_circuit_addrs([a_ for a_ in a.host.peerbook.addrs(b.host.peer_id) if a_.is_relayed])
            await eventually(lambda: all(a.loads.fresh(r.host.peer_id, time.monotonic()) for r in (loaded, idle)))
            conn = await a.host.open_bulk_connection(b.host.peer_id)
            assert via(a, conn) == idle.host.peer_id
        finally:
            await stop_all(a, b, *loaders, loaded, idle)
    run(main())


def test_a_relay_claiming_no_load_gets_no_more_than_its_share():
    """A liar always reports an empty relay; the honest relay beside it is idle too. Of A's eight
    circuits the liar carries four: claiming less than idle buys nothing."""
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        fit_connection_limit(a.host, 8)
        allow = {a.host.peer_id, b.host.peer_id}
        liar = await start_relay(set(allow), RelayLimits(max_circuits=16))
        liar.load_report = lambda: LoadReport(0, 1 << 31, 0, 1 << 31)
        honest = await start_relay(set(allow), RelayLimits(max_circuits=16))
        try:
            for relay in (liar, honest):
                await b.reserve(relay.host.listen_addrs[0])
            addrs = first_listed(b.relayed_addrs, liar)
            await a.refresh_loads([r.host.listen_addrs[0] for r in (liar, honest)])
            conns = [await a.dial(addrs, bulk=True) for _ in range(8)]
            assert sum(via(a, c) == liar.host.peer_id for c in conns) == 4
        finally:
            await stop_all(a, b, liar, honest)
    run(main())


def test_reservation_goes_to_the_less_loaded_relay_though_farther(monkeypatch):
    """B wants one reservation; the loaded relay answers pings fastest. B reserves on the idle one.
    Fails on the old choice (round-trip time only)."""
    async def main():
        b = await start_endpoint(want=1)
        loaded = await start_relay({b.host.peer_id}, RelayLimits(max_reservations=4))
        idle = await start_relay({b.host.peer_id}, RelayLimits(max_reservations=4))
        loaders = []
        for _ in range(3):
            other = await start_endpoint()
            loaded.admission.allow_list.add(other.host.peer_id)
            await other.reserve(loaded.host.listen_addrs[0])
            loaders.append(other)
        rtt = {loaded.host.peer_id: 0.001, idle.host.peer_id: 0.020}

        async def measure(relay_addr):
            await b.host.connect(str(relay_addr))
            return rtt[relay_addr.peer_id]
        monkeypatch.setattr(b, "_measure", measure)
        keeper = asyncio.create_task(b.maintain([r.host.listen_addrs[0] for r in (loaded, idle)]))
        try:
            await eventually(lambda: len(b.reservations) == 1, timeout=10)
            assert list(b.reservations) == [idle.host.peer_id]
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await stop_all(b, *loaders, loaded, idle)
    run(main())


def test_reservation_moves_when_its_relay_gets_loaded_and_the_old_one_still_serves(monkeypatch):
    """B holds one reservation; its relay then fills up. At the next load poll B reserves on the idle
    relay; the relay it left still hands B inbound circuits until that reservation expires."""
    monkeypatch.setattr(client_module, "LOAD_POLL_S", 0.3)
    monkeypatch.setattr(choice, "MIN_HOLD_S", 0.0)

    async def main():
        a, b = await start_endpoint(), await start_endpoint(want=1)
        allow = {a.host.peer_id, b.host.peer_id}
        first = await start_relay(set(allow), RelayLimits(max_reservations=4))
        keeper = asyncio.create_task(b.maintain([first.host.listen_addrs[0]]))
        loaders, second = [], None
        try:
            await eventually(lambda: list(b.reservations) == [first.host.peer_id])
            old_addrs = b.relayed_addrs
            for _ in range(3):
                other = await start_endpoint()
                first.admission.allow_list.add(other.host.peer_id)
                await other.reserve(first.host.listen_addrs[0])
                loaders.append(other)
            second = await start_relay(set(allow), RelayLimits(max_reservations=4))
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            keeper = asyncio.create_task(b.maintain([r.host.listen_addrs[0] for r in (first, second)]))
            await eventually(lambda: list(b.reservations) == [second.host.peer_id], timeout=10)
            conn = await a.dial(old_addrs)          # a peer with B's old record still gets through
            assert conn.remote_peer == b.host.peer_id and via(a, conn) == first.host.peer_id
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await stop_all(a, b, *loaders, first, second)
    run(main())


def test_a_silent_relay_does_not_hold_up_the_ranking():
    """Ranking never waits: a relay that swallows the load query just stays unknown."""
    async def main():
        a = await start_endpoint()
        held = []

        async def swallow(reader, writer):
            held.append(writer)
            await reader.read()
        silent = await asyncio.start_server(swallow, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        ghosts = [Identity.generate().peer_id for _ in range(2)]
        target = Identity.generate().peer_id
        try:
            addrs = [Multiaddr.parse(f"/ip4/127.0.0.1/tcp/{port}/p2p/{g}/p2p-circuit/p2p/{target}") for g in ghosts]
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert a.rank_circuit_addrs(addrs) == addrs
            assert loop.time() - started < 0.1
            await asyncio.sleep(0.3)
            assert all(a.loads.utilization(g) is None for g in ghosts)
        finally:
            silent.close()
            for writer in held:
                writer.close()
            await stop_all(a)
    run(main())


def test_a_node_reserves_on_the_less_loaded_relay_and_ranks_its_dials():
    """A home Node wanting one reservation: of two relays the one whose reservations are 3 of 4 full is
    passed over, ``/status`` shows each relay's load, and the Host ranks relayed dials by load."""
    home_id = Identity.generate()

    async def main():
        loaded = await start_relay({home_id.peer_id}, RelayLimits(max_reservations=4))
        idle = await start_relay({home_id.peer_id}, RelayLimits(max_reservations=4))
        loaders = []
        for _ in range(3):
            other = await start_endpoint()
            loaded.admission.allow_list.add(other.host.peer_id)
            await other.reserve(loaded.host.listen_addrs[0])
            loaders.append(other)
        config = node_config(relays=[r.host.listen_addrs[0] for r in (loaded, idle)], reserve=True, rpc=False,
                             reservations=1, hole_punch=False)
        node = Node(config, home_id, [basic_role("compute")])
        node.relay_client.ledger = None
        task = asyncio.create_task(node.run())
        try:
            await asyncio.wait_for(node.ready.wait(), 10)
            await eventually(lambda: node.relay_client.client.reservations)
            assert list(node.relay_client.client.reservations) == [idle.host.peer_id]
            status = (await node.status.snapshot())["relay_client"]
            assert status["relay_load"] == {loaded.host.peer_id: 0.75, idle.host.peer_id: 0.0}
            target = Identity.generate().peer_id
            addrs = [Multiaddr.parse(f"{r.host.listen_addrs[0]}/p2p-circuit/p2p/{target}") for r in (loaded, idle)]
            assert node.host._relay_ranking(addrs) == addrs[::-1]
        finally:
            node.request_stop()
            await asyncio.wait_for(task, 10)
            await stop_all(*loaders, loaded, idle)
    run(main())

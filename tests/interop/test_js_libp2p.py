"""Interop with js-libp2p (the version pinned in tests/interop/js/package.json, run by Node.js).

1. A js peer reserves on our relay; we reach it through the circuit (identify, ping both ways), and
   a Limit our relay announces reaches js in the spec's unit (seconds).
2. Our client reserves on a js relay; the Limit js announces (its default 2 min / 128 KiB, whose
   duration js puts on the wire in milliseconds) is read as 120 s, and the circuit carries ping.
3. DCUtR between our node and the js node through our relay, both roles (ADR 0204, ADR 0229).

Each test skips, saying why, when node or the npm modules are missing (`npm ci --prefix tests/interop/js`).
"""
import asyncio
import json
import socket

import pytest

from node.identity import Identity
from node.p2p.host import Host
from node.p2p.multiaddr import Multiaddr
from relay.holepunch import HolePuncher
from relay.holepunch_dial import upgrade_relayed
from relay.messages import Limit
from relay.policy import RelayLimits
from relay.service import Admission, RelayService
from tests.interop.js_process import JsPeer, missing
from tests.interop.netns_here import missing as netns_missing
from tests.interop.netns_here import public_loopback_netns
from tests.relay.relay_harness import start_endpoint, start_relay, stop_all

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


async def _identified(host, peer_id: str) -> str:
    for _ in range(100):
        record = host.peerbook.get(peer_id)
        if record is not None and record.agent_version:
            return record.agent_version
        await asyncio.sleep(0.05)
    raise AssertionError(f"identify with {peer_id} never completed")


@pytest.mark.parametrize("circuit_limit", [None, Limit(duration=600, data=1 << 20)])
def test_js_peer_reserves_on_our_relay_and_is_reached_through_the_circuit(circuit_limit):
    async def main():
        us = await start_endpoint()
        limits = RelayLimits(circuit_limit=circuit_limit)
        relay = await start_relay(set(), limits, admission={"stake_of": lambda peer: 1})
        js = await JsPeer.start("target", "127.0.0.1", relay.host.listen_addrs[0])
        try:
            [circuit] = await js.expect("RESERVED ")
            assert js.peer_id in relay.reservations
            conn = await us.dial([circuit])
            assert conn.remote_peer == js.peer_id and us.pipe_for(conn) is not None
            assert "js-libp2p" in await _identified(us.host, js.peer_id)
            assert await conn.ping() >= 0
            await js.command(f"ping {us.host.peer_id}")  # js pings us on the inbound circuit
            [rtt] = await js.expect("PING ")
            assert float(rtt) >= 0
            _, direction, remote, limits = await js.expect("CONN ", where=lambda f: "/p2p-circuit" in f[2])
            assert direction == "inbound" and us.host.peer_id in remote
            if circuit_limit is None:
                assert limits == "null"
            else:  # js reads our seconds as seconds (its LimitTracker: expires = now + duration * 1000)
                seen = json.loads(limits)
                assert 590 <= seen["seconds"] <= 600  # not 0.6 s, not 600000 s
                assert (1 << 20) - (64 << 10) < seen["bytes"] <= 1 << 20  # what is left of 1 MiB
        finally:
            await js.stop()
            await stop_all(us, relay)
    asyncio.run(asyncio.wait_for(main(), 60))


def test_our_client_reads_the_limit_of_a_js_relay_in_seconds():
    """js-libp2p's relay puts its 2-minute default on the wire as 120000 (milliseconds, against the
    spec's seconds); we read 120 s (ADR 0204), so the circuit counts as limited (signalling only)."""
    async def main():
        a, b = await start_endpoint(), await start_endpoint()
        js = await JsPeer.start("relay", "127.0.0.1")
        try:
            await b.reserve(js.addr)
            conn = await a.dial([f"{js.addr}/p2p-circuit/p2p/{b.host.peer_id}"])
            assert conn.remote_peer == b.host.peer_id
            assert conn.limit is not None and (conn.limit.duration, conn.limit.data) == (120, 128 << 10)
            assert conn.limited and await conn.ping() >= 0
            inbound = [c for c in b.host.connections(a.host.peer_id) if b.pipe_for(c) is not None]
            assert inbound and inbound[0].limit is not None and inbound[0].limit.duration == 120
        finally:
            await js.stop()
            await stop_all(a, b)
    asyncio.run(asyncio.wait_for(main(), 60))


# ---------------------------------------------------------------- DCUtR with js-libp2p
needs_netns = pytest.mark.skipif(netns_missing() is not None, reason=netns_missing() or "")


async def _punch_setup(ip: str):
    """Our relay and our endpoint (with a HolePuncher whose mapping the relay observed) on ``ip``,
    and a js peer (listening on ``ip``) that reserved on our relay."""
    host = Host(Identity.generate(), [f"/ip4/{ip}/tcp/0"])
    await host.start()
    relay = RelayService(host, Admission(stake_of=lambda peer: 1))
    relay.start()
    us = await start_endpoint()  # listens on 127.0.0.1 only: js sees no public address to dial back
    puncher = HolePuncher(us.host, punch_window=2.0, ipv6=False)
    puncher.start()
    relay_addr = relay.host.listen_addrs[0]
    assert await puncher.connect_public(relay_addr) == Multiaddr.parse(f"/ip4/{ip}/tcp/{puncher.port}")
    with socket.socket() as probe:
        probe.bind((ip, 0))
        port = probe.getsockname()[1]
    js = await JsPeer.start("target", ip, relay_addr, port=port)
    await js.expect("RESERVED ")
    return relay, us, puncher, js


async def _pings_during(host, peer_id: str, until: asyncio.Future) -> int:
    """Ping ``peer_id`` back to back until ``until`` is done; every ping must succeed."""
    count = 0
    while not until.done():
        assert await host.ping(peer_id) >= 0
        count += 1
    return count


def _direct(client, peer_id: str) -> list:
    return [c for c in client.host.connections(peer_id) if not c.closed and client.pipe_for(c) is None]


@needs_netns
def test_js_starts_dcutr_as_the_inbound_side_and_we_switch_to_the_punched_connection():
    """We dial the js peer through our relay; js (the circuit's inbound side, B) sends CONNECT, we
    answer, it sends SYNC, both dial: a direct connection, the relayed one closed by js, and our
    pings running through the switch all answered (ADR 0204's retry)."""
    async def main(ip):
        relay, us, puncher, js = await _punch_setup(ip)
        try:
            started = []
            original = puncher.direct_connect

            async def counted(conn):
                started.append(conn)
                return await original(conn)

            puncher.direct_connect = counted
            relayed = await us.dial([f"{relay.host.listen_addrs[0]}/p2p-circuit/p2p/{js.peer_id}"])
            upgrade = asyncio.ensure_future(upgrade_relayed(puncher, relayed, retire_after=0.5))
            retired = asyncio.ensure_future(  # js closes the circuit once its punch connected
                js.expect("CLOSE ", 15, where=lambda f: "/p2p-circuit" in f[1]))
            pings = await _pings_during(us.host, js.peer_id, asyncio.gather(upgrade, retired))
            path, _ = await asyncio.gather(upgrade, retired)
            assert path.kind == "punched", path
            assert path.conn.remote_peer == js.peer_id and us.pipe_for(path.conn) is None
            assert str(path.conn.remote_addr).startswith(f"/ip4/{ip}/tcp/")
            assert pings >= 1
            assert started == []  # js's CONNECT came first: we never started an exchange of our own
            await js.expect("CONN ", where=lambda f: "/p2p-circuit" not in f[2] and us.host.peer_id in f[2]
                            or f[2].startswith(f"/ip4/{ip}/"))
            assert relayed.closed or await asyncio.wait_for(_closed(relayed), 5)
            assert await us.host.ping(js.peer_id) >= 0 and _direct(us, js.peer_id)
        finally:
            await js.stop()
            await stop_all(us, relay)

    with public_loopback_netns() as ip:
        asyncio.run(asyncio.wait_for(main(ip), 60))


@needs_netns
def test_we_start_dcutr_as_the_inbound_side_and_js_answers():
    """The js peer dials us through our relay; we (the inbound side, B) send CONNECT, js answers
    as A and dials on our SYNC; we dial at half the round trip: a direct connection both see."""
    async def main(ip):
        relay, us, puncher, js = await _punch_setup(ip)
        await us.reserve(relay.host.listen_addrs[0])
        inbound: asyncio.Future = asyncio.get_running_loop().create_future()
        us.on_inbound(lambda conn: inbound.done() or inbound.set_result(conn))
        try:
            await js.command(f"dial {relay.host.listen_addrs[0]}/p2p-circuit/p2p/{us.host.peer_id}")
            await js.expect("DIALED ")
            relayed = await asyncio.wait_for(inbound, 10)
            direct = await puncher.direct_connect(relayed)
            assert direct is not None and direct.remote_peer == js.peer_id and us.pipe_for(direct) is None
            assert str(direct.remote_addr).startswith(f"/ip4/{ip}/tcp/")
            await js.expect("CONN ", where=lambda f: f[2].startswith(f"/ip4/{ip}/"))
            await js.command(f"ping {us.host.peer_id}")
            [rtt] = await js.expect("PING ")
            assert float(rtt) >= 0 and await direct.ping() >= 0
        finally:
            await js.stop()
            await stop_all(us, relay)

    with public_loopback_netns() as ip:
        asyncio.run(asyncio.wait_for(main(ip), 60))


async def _closed(conn) -> bool:
    while not conn.closed:
        await asyncio.sleep(0.05)
    return True

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

import pytest

from relay.messages import Limit
from relay.policy import RelayLimits
from tests.interop.js_process import JsPeer, missing
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

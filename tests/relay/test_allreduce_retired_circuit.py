"""The all-reduce keeps going when the relayed bulk connection its link runs on is retired. Two endpoints
reach each other only through a relay, so the all-reduce's bulk connections are circuits; the inbound side
punches around one (relay/holepunch_inbound.py) and retires it, mid-round. The link moves to a new stream on
a new connection between frames and no round fails (docs/adr/0233). Before, the long-lived link stream was
reset when the retire's drain time ran out and the round lost the peer ("link failed: StreamResetError:
yamux stream 1 was reset", the netlab training bench's failure)."""
import asyncio
import itertools

import torch
from relay_harness import start_relay, stop_all

from ml.allreduce import AllReduceGroup
from ml.compute.host_transport import HostTransport
from node.identity import Identity
from node.p2p.host import Host
from relay.client import RelayClient
from relay.holepunch import HolePuncher
from relay.holepunch_inbound import upgrade_inbound

RUN_S = 30.0     # rounds go on until the retire has come and gone, at most this long
NUMEL = 1 << 20   # 4 MiB a member: the retire comes while frames are on the way


async def _home() -> RelayClient:
    """An endpoint that listens nowhere (as behind a NAT): it is reached through the relay, or punched."""
    host = Host(Identity.generate(), listen_addrs=())
    await host.start()
    client = RelayClient(host)
    client.start()
    return client


async def _relayed_endpoints():
    a, b = await _home(), await _home()
    relay = await start_relay({a.host.peer_id, b.host.peer_id})
    relay_addr = relay.host.listen_addrs[0]
    punchers = []
    for endpoint in (a, b):
        puncher = HolePuncher(endpoint.host, punch_window=2.0, ipv6=False)
        puncher.start()
        await puncher.connect_public(relay_addr)
        punchers.append(puncher)
        endpoint.host.register_circuit_dialer(lambda maddr, bulk, c=endpoint: c.dial([str(maddr)], bulk=bulk))
        await endpoint.reserve(relay_addr)
    a.host.peerbook.add_addrs(b.host.peer_id, b.relayed_addrs)  # only relayed addresses: bulk goes over circuits
    b.host.peerbook.add_addrs(a.host.peer_id, a.relayed_addrs)
    return a, b, relay, punchers


def test_a_link_on_a_retired_relayed_bulk_connection_moves_and_no_round_fails():
    async def main():
        a, b, relay, punchers = await _relayed_endpoints()
        opened = []   # a's bulk connections to b: (connection, relayed when opened)
        open_bulk = a.host.open_bulk_connection

        async def recording(peer):
            conn = await open_bulk(peer)
            if peer == b.host.peer_id:   # not the dedicated connections to the relay that bulk circuits take
                opened.append((conn, conn.relayed))
            return conn

        a.host.open_bulk_connection = recording
        watcher = asyncio.create_task(upgrade_inbound(punchers[1], b))  # b punches around a's bulk circuit
        transports = [HostTransport(e.host) for e in (a, b)]
        peers = sorted(e.host.peer_id for e in (a, b))
        groups = [AllReduceGroup(t, e.host.peer_id, peers) for t, e in zip(transports, (a, b))]
        results, retired_at = [], None
        try:
            for group in groups:
                await group.start()
            deadline = asyncio.get_running_loop().time() + RUN_S
            for round_id in itertools.count():
                results.append(await asyncio.gather(*(
                    g.allreduce([torch.full((NUMEL,), float(i))], round_id) for i, g in enumerate(groups))))
                if retired_at is None and opened[0][0].closed:
                    retired_at = round_id
                if (retired_at is not None and round_id >= retired_at + 3
                        or asyncio.get_running_loop().time() > deadline):
                    break
                await asyncio.sleep(0.05)
            return results, retired_at, [(relayed, conn.closed) for conn, relayed in opened]
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            for group in groups:
                await group.close(linger_s=1.0)
            for transport in transports:
                await transport.close()
            await stop_all(a, b, relay)

    results, retired_at, bulk = asyncio.run(asyncio.wait_for(main(), 120))
    assert retired_at is not None, "b never punched around a's relayed bulk connection"
    assert bulk[0] == (True, True)           # the first was a circuit, retired during the rounds...
    assert len(bulk) >= 2 and bulk[-1][1] is False   # ...and the link moved to a new connection
    for pair in results:
        for result in pair:
            assert result.attempts == 1 and len(result.participants) == 2
            assert torch.allclose(result.tensors[0], torch.full((NUMEL,), 0.5))

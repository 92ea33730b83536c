"""The all-reduce over the node's p2p Hosts (HostTransport): exact mean, on bulk connections, and a
clear TransportError for a peer that cannot be reached."""
import asyncio

import pytest
import torch

from ml.allreduce import TransportError
from ml.compute.executor import make_group
from ml.compute.host_transport import HostTransport
from ml.train.spec import TrainSpec
from node.identity import Identity
from node.p2p.host import Host


def test_allreduce_over_hosts_uses_bulk_connections_and_gets_the_exact_mean():
    async def scenario():
        hosts = [Host(Identity.generate()) for _ in range(3)]
        for host in hosts:
            await host.start()
        transports = [HostTransport(host) for host in hosts]
        peers = sorted(host.peer_id for host in hosts)
        for host in hosts:
            for other in hosts:
                if other is not host:
                    host.peerbook.add_addrs(other.peer_id, other.listen_addrs)
        groups = [make_group(TrainSpec(codec="fp32"), t, h.peer_id, peers, bytes(32))
                  for t, h in zip(transports, hosts)]
        try:
            for group in groups:
                await group.start()
            inputs = [[torch.full((1000,), float(i)), torch.arange(7, dtype=torch.float32) * i] for i in range(3)]
            results = await asyncio.gather(*(g.allreduce(x, 0) for g, x in zip(groups, inputs)))
            bulk = [c.bulk for h in hosts for c in h.connections()]
            return results, bulk
        finally:
            for group in groups:
                await group.close()
            for transport in transports:
                await transport.close()
            for host in hosts:
                await host.stop()

    results, bulk = asyncio.run(scenario())
    for result in results:
        assert torch.equal(result.tensors[0], torch.full((1000,), 1.0))
        assert torch.equal(result.tensors[1], torch.arange(7, dtype=torch.float32))
        assert len(result.participants) == 3
    assert any(bulk)


def test_unreachable_peer_is_a_transport_error():
    async def scenario():
        host = Host(Identity.generate())
        await host.start()
        transport = HostTransport(host)
        stranger = Identity.generate().peer_id
        host.peerbook.add_addrs(stranger, ["/ip4/127.0.0.1/tcp/1"])
        try:
            with pytest.raises(TransportError):
                await transport.open_stream(stranger, "/dekube/allreduce/1/x")
        finally:
            await transport.close()
            await host.stop()

    asyncio.run(scenario())

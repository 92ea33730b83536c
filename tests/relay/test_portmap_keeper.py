"""Keeping a port mapping (ADR 0221): the keeper maps, renews at half the lifetime, reports the
address to its listener and deletes the mapping when cancelled (node stop); a silent gateway is a
logged error, not a crash. The node service maps only a non-loopback listen port, does nothing
when ``[nat] port_mapping`` is off, and the Host advertises mapped addresses before relayed ones."""
from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

from node.identity import Identity
from node.p2p.host import Host
from relay.portmap.keeper import MappingKeeper
from relay.portmap.mapper import PortMapper
from relay.portmap.service import PortMapService, listen_port
from tests.relay.test_portmap_mapper import serve
from tests.relay.test_portmap_wire import pcp_answer


def pcp_router(request: bytes) -> list[bytes]:
    lifetime = struct.unpack_from("!I", request, 4)[0]
    return [pcp_answer(nonce=request[24:36], lifetime=min(lifetime, 2), external=4001)]


async def _keeper_maps_renews_and_deletes_on_cancel():
    transport, gw, port = await serve(pcp_router)
    seen = []
    try:
        keeper = MappingKeeper(PortMapper("127.0.0.1", "127.0.0.1", 4001, udp_port=port), seen.append)
        task = asyncio.ensure_future(keeper.run())
        await asyncio.sleep(0.3)
        assert keeper.mapping is not None and [m.multiaddr for m in seen] == ["/ip4/11.99.0.101/tcp/4001"]
        assert len(gw.requests) == 1
        await asyncio.sleep(1.2)              # lifetime 2 s: renewed after 1 s, same address (no new report)
        assert len(gw.requests) == 2 and len(seen) == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert struct.unpack_from("!I", gw.requests[-1], 4)[0] == 0          # deleted: lifetime 0
        assert gw.requests[-1][24:36] == gw.requests[0][24:36]               # for the same nonce
        assert seen[-1] is None and keeper.mapping is None
    finally:
        transport.close()


async def _silent_gateway_is_an_error_and_a_retry():
    transport, gw, port = await serve(lambda request: [])
    try:
        keeper = MappingKeeper(PortMapper("127.0.0.1", "127.0.0.1", 4001, udp_port=port, budget=0.3,
                                          protocols=("pcp", "nat-pmp")), retry_s=0.2)
        task = asyncio.ensure_future(keeper.run())
        await asyncio.sleep(1.0)
        assert keeper.mapping is None and "no answer" in (keeper.last_error or "")
        assert sum(r[0] == 2 for r in gw.requests) >= 2      # PCP asked again after retry_s
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    finally:
        transport.close()


def test_keeper_maps_renews_and_deletes_on_cancel():
    asyncio.run(_keeper_maps_renews_and_deletes_on_cancel())


def test_silent_gateway_is_an_error_and_a_retry():
    asyncio.run(_silent_gateway_is_an_error_and_a_retry())


def test_listen_port_skips_loopback_and_ipv6():
    assert listen_port(["/ip4/127.0.0.1/tcp/4001"]) is None
    assert listen_port(["/ip6/::/tcp/4002", "/ip4/0.0.0.0/tcp/4001"]) == 4001
    assert listen_port(["/ip4/192.168.1.2/tcp/4003/p2p/12D3KooWGzWb6c7rNfr5xNTC9ArRnUsEyfjU2v1ZmXbqPdj4zJGt"]) == 4003


def fake_node(enabled: bool, listen: list[str]):
    sections: dict = {}
    ready = asyncio.Event()
    ready.set()
    return SimpleNamespace(config={"nat": {"port_mapping": enabled}}, ready=ready,
                           status=SimpleNamespace(add_section=sections.__setitem__), sections=sections,
                           host=SimpleNamespace(listen_addrs=listen), relay_client=None)


def test_service_off_or_on_loopback_maps_nothing():
    off = PortMapService(fake_node(False, ["/ip4/0.0.0.0/tcp/4001"]))
    asyncio.run(asyncio.wait_for(off.run(), 1))
    assert off.keepers == {} and off.status()["state"] == "off"
    loop_only = PortMapService(fake_node(True, ["/ip4/127.0.0.1/tcp/4001"]))
    asyncio.run(asyncio.wait_for(loop_only.run(), 1))
    assert loop_only.keepers == {} and loop_only.status()["state"] == "no listen address to map"


def test_host_advertises_mapped_addresses_before_relayed_ones():
    host = Host(Identity.from_seed(bytes(32)))
    host.advertise_extra_addrs(lambda: ["/ip4/10.99.0.10/tcp/4001/p2p-circuit"])
    host.advertise_extra_addrs(lambda: ["/ip4/11.99.0.101/tcp/4001"], source="port_mapping")
    assert host.extra_addrs() == ["/ip4/11.99.0.101/tcp/4001", "/ip4/10.99.0.10/tcp/4001/p2p-circuit"]
    host.advertise_extra_addrs(None, source="port_mapping")
    assert host.extra_addrs() == ["/ip4/10.99.0.10/tcp/4001/p2p-circuit"]

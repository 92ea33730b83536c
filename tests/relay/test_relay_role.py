"""The relay role inside a Node: config-driven admission, reservations served, /status section."""
import asyncio

import pytest
from relay_harness import start_endpoint, stop_all

from node.config import load_config
from node.identity import Identity
from node.roles import RoleError
from node.runtime import Node
from relay.client import RelayRefused
from relay.messages import Status
from relay.role import RelayRole


def node_config(allow):
    return load_config(None, overrides={("rpc", "enabled"): "false", ("p2p", "listen"): "/ip4/127.0.0.1/tcp/0",
                                        ("relay", "allow_list"): ",".join(allow), ("relay", "reservation_ttl"): "60"})


def test_relay_role_serves_allow_listed_peers_only():
    async def main():
        member, outsider = await start_endpoint(), await start_endpoint()
        node = Node(node_config([member.host.peer_id]), Identity.generate(), ["relay"])
        task = asyncio.create_task(node.run())
        try:
            await asyncio.wait_for(node.ready.wait(), 10)
            addr = node.host.listen_addrs[0]
            rsvp = await member.reserve(addr)
            assert 55 <= rsvp.expire - rsvp.granted_at <= 61
            with pytest.raises(RelayRefused) as info:
                await outsider.reserve(addr)
            assert info.value.status == Status.PERMISSION_DENIED
            status = (await node.status.snapshot())["relay"]
            assert status["reservations"] == 1 and status["reservations_refused"] == 1
            assert "dekube_relay_reservations 1.0" in node.metrics.render()
        finally:
            node.request_stop()
            await asyncio.wait_for(task, 10)
            await stop_all(member, outsider)
    asyncio.run(main())


def test_bad_allow_list_is_a_clear_error():
    with pytest.raises(RoleError, match="invalid peer IDs"):
        Node(node_config(["not-a-peer"]), Identity.generate(), [RelayRole])


def test_the_relay_section_sets_every_limit_and_the_circuit_limit():
    """[relay]'s limits default to RelayLimits (one place) and the circuit Limit is configurable (ADR 0201)."""
    from node.config import defaults
    from relay.messages import Limit
    from relay.policy import RelayLimits
    from relay.settings import limits

    assert limits(defaults()["relay"]) == RelayLimits()
    overrides = {("rpc", "enabled"): "false", ("p2p", "listen"): "/ip4/127.0.0.1/tcp/0",
                 ("relay", "circuit_limit_seconds"): "120", ("relay", "circuit_limit_bytes"): "1048576",
                 ("relay", "max_circuits"): "7", ("relay", "receipt_interval_bytes"): "4096"}
    role = Node(load_config(None, overrides=overrides), Identity.generate(), [RelayRole]).role("relay")
    got = role.service.limits
    assert (got.circuit_limit, got.max_circuits, got.receipt_interval_bytes) == (Limit(120, 1 << 20), 7, 4096)
    only_data = load_config(None, overrides={("relay", "circuit_limit_bytes"): "65536"})
    assert limits(only_data["relay"]).circuit_limit == Limit(duration=None, data=65536)

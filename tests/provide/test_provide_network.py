"""Before start, ``provide`` measures this machine's bandwidth to a bootstrap peer over the product
transport and asks for an AutoNAT dial-back (cli/provide_network.py, docs/adr/0198): against a relay
node on loopback both succeed (public: the relay role is added); against a peer that serves no AutoNAT
the reachability stays unknown; with nobody to ask it says why, bounded in time."""
import asyncio
import socket
import time

from cli.provide_network import dialable, measure, probe_targets
from tests.node.node_harness import running_node


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bandwidth_and_reachability_against_a_relay():
    async def go():
        async with running_node(["relay"]) as (node, _):
            addr = f"{node.host.listen_addrs[0]}/p2p/{node.peer_id}"
            measured = await measure([addr], f"/ip4/127.0.0.1/tcp/{free_port()}", timeout_s=20)
            assert measured.peer == node.peer_id and measured.upload_mbps > 1 and measured.download_mbps > 1
            assert measured.reachability == "public" and "this node also relays" in measured.describe()

        async with running_node(["compute"]) as (node, _):   # serves the probe, not AutoNAT
            addr = f"{node.host.listen_addrs[0]}/p2p/{node.peer_id}"
            measured = await measure([addr], f"/ip4/127.0.0.1/tcp/{free_port()}", timeout_s=20)
            assert measured.upload_mbps > 1 and measured.reachability == "unknown"
            assert "no relay role" in measured.describe()

    asyncio.run(go())


def test_nobody_to_ask_is_said_and_bounded():
    async def go():
        assert "names its peer" in (await measure(["/ip4/127.0.0.1/tcp/1"], "/ip4/127.0.0.1/tcp/0")).error
        start = time.monotonic()
        dead = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWAsXWKUHvsg6qrf8TkSqv5XuMHcnczfQ4zZtSPzQSZoX1"
        measured = await measure([dead], "/ip4/127.0.0.1/tcp/0", timeout_s=5)
        assert measured.upload_mbps is None and measured.error and time.monotonic() - start < 8
        assert measured.describe().startswith("bandwidth not measured")

    asyncio.run(go())
    assert dialable(["/ip4/1.2.3.4/tcp/1", "/ip4/1.2.3.4/tcp/1/p2p/x", "junk"]) == []
    validators = [("12D3KooWpeer", ("/ip4/1.2.3.4/tcp/4001",))]
    assert probe_targets([], validators) == ["/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWpeer"]
    assert probe_targets(["/dns4/a/tcp/1/p2p/Q"], []) == ["/dns4/a/tcp/1/p2p/Q"]

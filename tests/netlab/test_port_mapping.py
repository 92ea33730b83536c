"""Port mapping against a real router (ADR 0221): a home behind the zoo's ``upnp`` router (miniupnpd
in the router's namespace, nftables) gets mappings by PCP, NAT-PMP and UPnP-IGD alike; a peer on the
backbone dials the advertised address directly (no relay anywhere in the lab), the mapping's DNAT rule
goes when the node stops; a real dekube Node's port-mapping service does the same on its own; and
the ``upnp`` x ``symmetric`` pair (relayed for symmetric x symmetric) ends on a direct connection,
because the mapped punch port is offered first in DCUtR. Skips with the reason without root, nft or
miniupnpd."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devtools.netlab import upnp
from devtools.netlab.lab import Lab, unavailable
from devtools.netlab.net import PUNCH
from devtools.netlab.nodes import NODE_AGENT, REPO_ROOT, Node, agents_in, peer_id_of
from devtools.netlab.scenarios import poll, punch

pytestmark = pytest.mark.netlab
PORT = 4001
MAP_SCRIPT = """
import asyncio, json
from relay.portmap.gateway import default_gateway, local_address
from relay.portmap.mapper import PortMapper
async def main():
    gateway = default_gateway()
    out = {}
    for protocol in ("pcp", "nat-pmp", "upnp"):
        mapper = PortMapper(gateway, local_address(gateway), 4100, budget=3, protocols=(protocol,))
        mapping = await mapper.map()
        renewed = await mapper.renew(mapping)
        await mapper.delete(mapping)
        out[protocol] = [mapping.multiaddr, renewed.multiaddr, mapping.lifetime]
    print(json.dumps(out))
asyncio.run(main())
"""


@pytest.fixture(autouse=True)
def _needs_lab():
    why = unavailable() or upnp.unavailable()
    if why:
        pytest.skip(why)


def dnat_rules(router_ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", router_ns, "nft", "list", "chain", "inet", "filter",
                           "prerouting_miniupnpd"], capture_output=True, text=True, check=True).stdout


def test_each_protocol_maps_renews_and_deletes_on_miniupnpd():
    lab = Lab().build([], ["upnp"])
    try:
        home = lab.homes[0]
        out = subprocess.run(["ip", "netns", "exec", home.ns, sys.executable, "-c", MAP_SCRIPT], capture_output=True,
                             text=True, timeout=60, cwd=REPO_ROOT)
        assert out.returncode == 0, out.stderr[-2000:]
        expected = f"/ip4/{home.wan_ip}/tcp/4100"
        for protocol, (mapped, renewed, lifetime) in json.loads(out.stdout).items():
            assert mapped == renewed == expected, protocol
            assert lifetime == 7200, protocol
        assert "4100" not in dnat_rules(home.router_ns)     # every mapping was deleted
    finally:
        lab.teardown()


def test_a_public_peer_dials_the_mapped_address_directly():
    with agents_in(Lab().build(["peer"], ["upnp"])) as (lab, agents):
        home = lab.homes[0]
        mapped_node = Node.start("pm1", home.ns, f"/ip4/{home.ip}/tcp/{PORT}", "--port-map")
        agents.append(mapped_node)
        peer = Node.start("pmpeer", lab.ns_of("peer"), f"/ip4/{lab.public['peer']}/tcp/{PORT}")
        agents.append(peer)
        mapping = mapped_node.call("port_mapping")
        assert mapping["listen"] == f"/ip4/{home.wan_ip}/tcp/{PORT}", mapping
        assert mapping["punch"] == f"/ip4/{home.wan_ip}/tcp/{mapped_node.punch_port}", mapping
        assert f"dport {PORT}" in dnat_rules(home.router_ns)
        rtt = peer.call("ping", addr=f"{mapping['listen']}/p2p/{mapped_node.peer_id}")
        assert 0 < rtt < 1
        assert mapped_node.call("paths", peer=peer.peer_id) == ["direct"]
        mapped_node.stop()
        assert f"dport {PORT}" not in dnat_rules(home.router_ns)   # deleted on stop


def test_a_node_maps_its_listen_port_and_is_dialled_directly():
    """The product's service (``[nat] port_mapping`` on by default) in a real Node behind the router."""
    with agents_in(Lab().build(["relay", "peer"], ["upnp"])) as (lab, agents):
        home = lab.homes[0]
        relay = Node.start("pmrelay", lab.ns_of("relay"), f"/ip4/{lab.public['relay']}/tcp/{PORT}", "--relay",
                           "--allow", peer_id_of("pmnode"))
        agents.append(relay)
        node = Node.start("pmnode", home.ns, f"/ip4/{home.ip}/tcp/{PORT}", "--relays", relay.addr, agent=NODE_AGENT)
        agents.append(node)
        status = poll(lambda: (s := node.call("port_mapping"))["mappings"].get("punch", {}).get("addr") and s, 20,
                      0.1, "the node's port mappings")
        assert status["mappings"]["listen"]["addr"] == f"/ip4/{home.wan_ip}/tcp/{PORT}"
        assert status["mappings"]["listen"]["protocol"] == "pcp"
        punch_port = node.call("hole_punch")["punch_port"]
        assert status["mappings"]["punch"]["addr"] == f"/ip4/{home.wan_ip}/tcp/{punch_port}"
        peer = Node.start("pmpeer2", lab.ns_of("peer"), f"/ip4/{lab.public['peer']}/tcp/{PORT}")
        agents.append(peer)
        assert peer.call("ping", addr=f"/ip4/{home.wan_ip}/tcp/{PORT}/p2p/{node.peer_id}") < 1
        assert node.call("paths", peer=peer.peer_id) == ["direct"]
        node.stop()
        assert f"dport {PORT}" not in dnat_rules(home.router_ns)


def test_upnp_meets_a_random_symmetric_nat_directly():
    homes = ["upnp", "symmetric"]
    with agents_in(Lab().build(["relay"], homes)) as (lab, agents):
        names = ["pmu", "pms"]
        relay = Node.start("pmrelay2", lab.ns_of("relay"), f"/ip4/{lab.public['relay']}/tcp/{PORT}", "--relay",
                           "--allow", ",".join(peer_id_of(n) for n in names))
        agents.append(relay)
        up, sym = (Node.start(n, h.ns, f"/ip4/{h.ip}/tcp/{PORT}", *PUNCH, "--port-map")
                   for n, h in zip(names, lab.homes))
        agents += [up, sym]
        assert sym.call("port_mapping")["listen"] is None           # the symmetric router maps nothing
        out = punch(up, sym, relay)
        assert out["conn"]["direct"], out

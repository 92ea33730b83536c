"""DCUtR over QUIC across the netlab's NATs (ADR 0228).

One lab, a relay listening on TCP and QUIC, and three pairs of homes: two port-restricted homes
that punch over QUIC only (``--no-tcp-punch``) end on a direct QUIC connection; two
``symmetric-tcp`` homes (random TCP mappings, endpoint-independent UDP ones) end direct over QUIC
with both punches running, while two such homes without QUIC stay relayed (their TCP punch
cannot work). Each pair's first home dials the second through the relay and punches. And two
random-symmetric homes with IPv6 beside, punching over QUIC only, end direct over QUIC on IPv6.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from devtools.netlab.lab import Lab, unavailable
from devtools.netlab.nat_matrix import run_matrix
from devtools.netlab.net import PUNCH
from devtools.netlab.nodes import Node, peer_id_of
from devtools.netlab.scenarios import circuits_via

pytestmark = pytest.mark.netlab
PORT = 4001
# (NAT kind, listen on QUIC, punch over TCP) of each pair
PAIRS = {"quic-only": ("port-restricted", True, False), "both": ("symmetric-tcp", True, True),
         "tcp-only": ("symmetric-tcp", False, True)}


def quic_of(node: Node) -> str:
    return next(a for a in node.addrs if "/quic-v1" in a)


@pytest.fixture(scope="module")
def outcomes():
    why = unavailable()
    if why:
        pytest.skip(why)
    kinds = [kind for kind, _quic, _tcp in PAIRS.values() for _ in range(2)]
    lab = Lab(prefix=f"dk{os.getpid()}q").build(["relay"], kinds)   # beside the matrix test's own lab
    names = [f"q{i}" for i in range(1, len(kinds) + 1)]
    nodes: list[Node] = []
    try:
        ip = lab.public["relay"]
        relay = Node.start("qrelay", lab.ns_of("relay"), f"/ip4/{ip}/tcp/{PORT}", "--quic",
                           f"/ip4/{ip}/udp/{PORT}/quic-v1", "--relay", "--allow", ",".join(map(peer_id_of, names)))
        nodes.append(relay)
        flags = [flag for _kind, quic, tcp in PAIRS.values() for flag in [(quic, tcp)] * 2]

        def start(i: int) -> Node:
            record = lab.homes[i]
            quic, tcp = flags[i]
            extra = (["--quic", f"/ip4/{record.ip}/udp/{PORT}/quic-v1"] if quic else []) + ([] if tcp else
                                                                                          ["--no-tcp-punch"])
            return Node.start(names[i], record.ns, f"/ip4/{record.ip}/tcp/{PORT}", *PUNCH, *extra)

        with ThreadPoolExecutor(len(names)) as pool:
            homes = list(pool.map(start, range(len(names))))
        nodes += homes

        def punch(pair: int) -> dict:
            dialer, dialed = homes[2 * pair], homes[2 * pair + 1]
            for node in (dialer, dialed):
                node.call("connect_public", addr=relay.addr)
                if flags[2 * pair][0]:
                    assert "/quic-v1" in node.call("connect_public", addr=quic_of(relay))
            circuits = circuits_via(dialed.call("reserve", relay=relay.addr), relay)
            return dialer.call("connect", circuits=circuits, punch=True, timeout=60)

        with ThreadPoolExecutor(len(PAIRS)) as pool:
            yield dict(zip(PAIRS, pool.map(punch, range(len(PAIRS)))))
    finally:
        for node in nodes:
            node.stop()
        lab.teardown()


def test_port_restricted_homes_punching_only_over_quic_end_direct_over_quic(outcomes):
    out = outcomes["quic-only"]
    assert out["direct"] and out["quic"], out
    assert out["quic_packets"] >= 1, out   # the initiator opened its NAT with random datagrams


def test_homes_whose_nat_randomises_tcp_but_not_udp_end_direct_over_quic(outcomes):
    assert outcomes["both"]["direct"] and outcomes["both"]["quic"], outcomes["both"]
    assert not outcomes["tcp-only"]["direct"], outcomes["tcp-only"]   # TCP alone stays relayed


def test_random_symmetric_homes_with_ipv6_end_direct_over_quic_on_ipv6():
    """Their IPv4 NATs map every flow to a random port (no QUIC punch meets both), but each home
    offers its QUIC listener's global IPv6 address (ADR 0224's stateful firewall, opened by the
    server side's random datagrams)."""
    why = unavailable()
    if why:
        pytest.skip(why)
    out = run_matrix(("symmetric+v6",), punch_args=(*PUNCH, "--no-tcp-punch"), quic=True)
    result = out["by_pair"]["symmetric+v6/symmetric+v6"]
    assert result["direct"] and result["quic"], out
    assert result["remote"].startswith("2001:db8:"), out

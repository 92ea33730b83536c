"""The NAT zoo's kinds behave as RFC 4787 defines them (UDP probes, ``nat_probe.py``).

One lab with a home per kind and three public hosts; for each kind: whether the home's mapping is
the same for two destinations (and, for sequential symmetric NAT, one port apart), and which of
three knocks on the mapping seen by the first destination reach the home: from that destination,
from its address with another port, from a host never contacted. ``udp-blocked`` drops every
datagram: no mapping is seen, no knock arrives. The TCP side: from one local port, a home's TCP
mappings towards two hosts are equal where the kind maps TCP endpoint-independently (``udp-blocked``
included) and differ where it is random.
"""
from __future__ import annotations

import pytest

from devtools.netlab.lab import Lab, unavailable
from devtools.netlab.nat_probe import probe, tcp_mappings

pytestmark = pytest.mark.netlab

# kind -> (endpoint-independent mapping, knock from the contacted address+port, other port, third party)
EXPECTED = {
    "full-cone": (True, True, True, True),
    "restricted": (True, True, True, False),
    "port-restricted": (True, True, False, False),
    "eim": (True, True, False, False),
    "symmetric-seq": (False, True, False, False),
    "symmetric": (False, True, False, False),
    "symmetric-tcp": (True, True, False, False),   # its UDP mappings (TCP ones are random)
    "cgnat": (True, True, False, False),
    "udp-blocked": None,                           # no UDP gets through: no mapping seen, no knock
}
TCP_EIM = {"udp-blocked": True, "port-restricted": True, "symmetric": False, "symmetric-tcp": False}


@pytest.fixture(scope="module")
def zoo():
    why = unavailable()
    if why:
        pytest.skip(why)
    lab = Lab().build(["stun1", "stun2", "stranger"], list(EXPECTED))
    try:
        yield lab
    finally:
        lab.teardown()


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_nat_kind_maps_and_filters_as_rfc_4787_says(zoo, kind):
    record = next(h for h in zoo.homes if h.nat == kind)
    out = probe(zoo, record, ("stun1", "stun2", "stranger"))
    if EXPECTED[kind] is None:
        assert out["mappings"] == [None, None], out
        assert not (out["from_contacted"] or out["from_other_port"] or out["from_third_party"]), out
        return
    first, second = out["mappings"]
    assert first and second, out
    assert {m.rsplit(":", 1)[0] for m in (first, second)} == {record.wan_ip}, out
    eim, contacted, other_port, third = EXPECTED[kind]
    assert (first == second) == eim, out
    knocks = (out["from_contacted"], out["from_other_port"], out["from_third_party"])
    assert knocks == (contacted, other_port, third), out
    if kind == "symmetric-seq":
        assert int(second.rsplit(":", 1)[1]) == int(first.rsplit(":", 1)[1]) + 1, out


@pytest.mark.parametrize("kind", list(TCP_EIM))
def test_tcp_mapping_is_endpoint_independent_where_the_kind_says(zoo, kind):
    record = next(h for h in zoo.homes if h.nat == kind)
    first, second = tcp_mappings(zoo, record, ("stun1", "stun2"))
    assert first and second, (first, second)
    assert {m.rsplit(":", 1)[0] for m in (first, second)} == {record.wan_ip}, (first, second)
    assert (first == second) == TCP_EIM[kind], (first, second)

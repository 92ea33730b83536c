"""On the emulated internet: the owner on a public host follows a worker behind a NAT router through a
relay (its relayed address only; hole punching off) over /dekube/task-progress/1.0.0 until the job
ends; and the bandwidth probe between two public hosts measures a 40 Mbit/s uplink shaped with tc.
Skipped without root and namespaces."""
from __future__ import annotations

import pytest

from devtools.netlab.lab import Lab, shape, unavailable
from devtools.netlab.nodes import Node, agents_in, peer_id_of

pytestmark = pytest.mark.netlab

AGENT = "devtools.netlab.progress_agent"
TASK = "5a" * 32


@pytest.fixture(scope="module")
def lab():
    why = unavailable()
    if why:
        pytest.skip(why)
    with agents_in(Lab(home_rate_mbit=100).build(["relay1", "owner", "pub2"], ["eim"])) as held:
        yield held


def test_owner_follows_a_natd_worker_through_a_relay(lab):
    lab, agents = lab
    allow = ",".join(peer_id_of(n) for n in ("worker", "owner"))
    relay = Node.start("relay1", lab.ns_of("relay1"), f"/ip4/{lab.public['relay1']}/tcp/4001", "--relay",
                       "--allow", allow)
    agents.append(relay)
    home = lab.homes[0]
    worker = Node.start("worker", home.ns, f"/ip4/{home.ip}/tcp/4001", "--relays", relay.addr, agent=AGENT)
    agents.append(worker)
    owner = Node.start("owner", lab.ns_of("owner"), f"/ip4/{lab.public['owner']}/tcp/4001", agent=AGENT)
    agents.append(owner)
    relayed = worker.info["relayed_addrs"]
    assert relayed and all("/p2p-circuit/" in a for a in relayed)
    worker.call("run_job", task=TASK, steps=20, step_s=0.1)
    got = owner.call("follow", timeout=60, peer=worker.peer_id, addrs=relayed, task=TASK)
    updates = got["updates"]
    assert got["paths"] == ["relayed"]
    assert updates[-1]["state"] == "committed" and updates[-1]["step"] == 20 and updates[-1]["result"] == "ab" * 32
    assert len(updates) >= 3 and [u["step"] for u in updates] == sorted(u["step"] for u in updates)


def test_probe_measures_a_shaped_uplink(lab):
    lab, agents = lab
    shape(lab.ns_of("pub2"), "eth0", 40)
    prober = Node.start("prober", lab.ns_of("pub2"), f"/ip4/{lab.public['pub2']}/tcp/4002", agent=AGENT)
    agents.append(prober)
    target = Node.start("target", lab.ns_of("owner"), f"/ip4/{lab.public['owner']}/tcp/4002", agent=AGENT)
    agents.append(target)
    figures = prober.call("probe", timeout=60, peer=target.peer_id, addrs=target.addrs, size=4 << 20)
    print("probe over a 40 Mbit/s uplink:", figures)
    assert 28 <= figures["upload_mbps"] <= 44, figures          # the shaped direction
    assert figures["download_mbps"] > 60, figures               # the other one is not shaped
    assert figures["latency_s"] is not None

"""The main job on the emulated internet: validators and relays on public hosts, four compute nodes
each behind its own NAT router (one symmetric), all real ``dekube-node start`` processes. A paid
digits task is assigned, trained with an int8 all-reduce among three NAT'd workers that reach each
other only by the relayed addresses in their ledger records, committed, audited (the ledger draws
audit slots; their verifiers replay a segment of each worker over the relays, docs/adr/0168) and
paid; the relays carried the traffic and the supply is conserved."""
from __future__ import annotations

import json

import pytest

from devtools.netlab.lab import unavailable
from devtools.netlab.task_net import TaskNet

pytestmark = pytest.mark.netlab

PRICE = 100_000


@pytest.fixture(scope="module")
def task_net(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(why)
    with TaskNet.running(tmp_path_factory.mktemp("tasknet") / "net") as net:
        yield net


def test_nated_compute_nodes_train_verify_and_get_paid(task_net):
    net = task_net
    for member in net.compute:  # nobody can dial a home: the ledger offers private and relayed addresses
        info = net.rpc("dkb_getNode", member.peer_id)
        assert all(addr.startswith("/ip4/192.168.") for addr in info["listen_addrs"])
        assert len(info["relay_addrs"]) == 2 and all("/p2p-circuit/" in a for a in info["relay_addrs"])
    relayed_before = sum(net.metric(r, "dekube_relay_bytes_total") for r in net.relays)
    out = net.cli("task", "submit", "--rpc", net.testnet.nodes[0].rpc_url, "--key", str(net.testnet.faucet_key),
                  "--model", "mlp", "--dataset", "digits", "--workers", "3", "--codec", "int8", "--steps", "60",
                  "--price", str(PRICE), "--wait", "--timeout", "400", "--json")
    task = json.loads(out)
    assert task["status"] == "paid", task
    workers = set(task["workers"])
    assert len(workers) == 3 and workers <= {m.peer_id for m in net.compute}
    assert set(task["commits"]) == workers
    assert len({commit[1] for commit in task["commits"].values()}) == 1   # one agreed model
    assert len({commit[0] for commit in task["commits"].values()}) == 3   # per-worker segment records (ADR 0167)
    # every worker's drawn segments were replayed by ledger-drawn verifiers (over the relays) and matched
    slots = task["slots"]
    assert {s["worker"] for s in slots} == workers and all(s["outcome"] == "ok" for s in slots), slots
    verifiers = {v["verifier"] for s in slots for v in s["verifiers"] if v["answer"] is not None}
    assert verifiers and all(v["verifier"] != s["worker"] for s in slots for v in s["verifiers"])
    assert sum(task["payouts"].values()) == PRICE and all(task["payouts"][w] > 0 for w in workers)
    assert all(task["payouts"][v] > 0 for v in verifiers)
    supply = net.rpc("dkb_getSupply")
    assert supply["total"] == supply["genesis"]
    relayed = sum(net.metric(r, "dekube_relay_bytes_total") for r in net.relays) - relayed_before
    assert relayed > 256 << 10, relayed  # the homes' all-reduce and segment traffic went through relays
    # relay bytes per task (ADR 0223): each worker's count of the relayed all-reduce circuits it opened,
    # per registered relay; the relays carried those bytes and more (segments, progress, control)
    reports = task.get("relay_bytes", {})
    assert set(reports) <= workers and all(set(r) <= {m.peer_id for m in net.relays} for r in reports.values())
    reported = sum(n for report in reports.values() for n in report.values())
    assert reported <= relayed + (16 << 20), (reported, relayed)
    print(f"relays carried {relayed} bytes in all, {reported} reported for the task's all-reduce: {reports}")

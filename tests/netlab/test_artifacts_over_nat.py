"""Artifacts on the emulated internet: a downloader on a public host fetches one artifact from two
holders at once, one public and one behind a NAT router that it reaches only through a relay (its
relayed address; hole punching off), both real Nodes; both serve chunks, the relayed path carries
the NAT'd holder's share, and the file is verified. Then ``dekube-node artifact get`` fetches it from
the NAT'd holder's relayed address alone. Skipped without root and namespaces."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.netlab.artifact_net import link_into, seed_store, start_agent
from devtools.netlab.lab import Lab, unavailable
from devtools.netlab.nodes import Node, agents_in, peer_id_of, seed_of
from node.identity import Identity
from node.keystore import save_identity

pytestmark = pytest.mark.netlab

SIZE_MB = 24


@pytest.fixture(scope="module")
def lab():
    why = unavailable()
    if why:
        pytest.skip(why)
    with agents_in(Lab(home_rate_mbit=200).build(["relay1", "pub", "dl"], ["eim"])) as held:
        yield held


def test_download_from_a_public_and_a_relayed_nated_holder(lab, tmp_path):
    lab, agents = lab
    allow = ",".join(peer_id_of(n) for n in ("home_holder", "pub_holder", "downloader", "cli"))
    relay = Node.start("relay1", lab.ns_of("relay1"), f"/ip4/{lab.public['relay1']}/tcp/4001", "--relay",
                       "--allow", allow)
    agents.append(relay)
    store = tmp_path / "seed" / "artifacts"
    artifact = seed_store(store, SIZE_MB)
    for name in ("home_holder", "pub_holder"):
        link_into(store, tmp_path / name, artifact)
    home = lab.homes[0]
    home_holder = start_agent("home_holder", home.ns, f"/ip4/{home.ip}/tcp/4001", tmp_path / "home_holder",
                              [relay.addr], "--no-hole-punch")
    agents.append(home_holder)
    pub_holder = start_agent("pub_holder", lab.ns_of("pub"), f"/ip4/{lab.public['pub']}/tcp/4001",
                             tmp_path / "pub_holder")
    agents.append(pub_holder)
    downloader = start_agent("downloader", lab.ns_of("dl"), f"/ip4/{lab.public['dl']}/tcp/4001",
                             tmp_path / "downloader")
    agents.append(downloader)
    assert home_holder.call("has", artifact=artifact) and not downloader.call("has", artifact=artifact)
    relayed = home_holder.info["relayed_addrs"]
    assert relayed and all("/p2p-circuit/" in a for a in relayed)
    report = downloader.call("fetch", timeout=120, artifact=artifact,
                             holders={home_holder.peer_id: relayed, pub_holder.peer_id: pub_holder.addrs})
    assert report["size"] == SIZE_MB << 20 and report["received_bytes"] == report["size"]
    assert not report["bad_holders"] and not report["dropped"], report
    assert report["per_holder"][home_holder.peer_id] > 0 and report["per_holder"][pub_holder.peer_id] > 0, report
    assert downloader.call("paths", peer=home_holder.peer_id) == ["relayed"]
    assert downloader.call("has", artifact=artifact)
    # the CLI, from another public host, reaches the NAT'd holder by its relayed address alone
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "cli-out.bin"
    key = save_identity(tmp_path / "cli-key.json", Identity.from_seed(bytes.fromhex(seed_of("cli"))))
    env = {**os.environ, "PYTHONPATH": str(repo)}
    got = subprocess.run(["ip", "netns", "exec", lab.ns_of("pub"), sys.executable, "-m", "cli.main", "artifact", "get",
                          artifact, "--out", str(out), "--from", relayed[0], "--quiet", "--key", str(key), "--home",
                          str(tmp_path / "cli-home")], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert out.read_bytes() == Path(report["path"]).read_bytes()

"""Manifest parsing, the perturbation plan and the fault budget of devtools.perturb."""
import random
from pathlib import Path

import pytest

from devtools.perturb.manifest import ManifestError, load_manifest, parse_manifest
from devtools.perturb.runner import plan

MANIFESTS = Path(__file__).resolve().parents[2] / "devtools" / "perturb" / "manifests"

MINIMAL = """
perturbations = 30
min_each = 2
[network]
validators = 7
disk_nodes = ["v6"]
[perturb.kill]
weight = 5
[perturb.disk_full]
weight = 1
duration = [1, 2]
[perturb.pause]
weight = 0
"""


def test_shipped_manifests_parse():
    ci = load_manifest(MANIFESTS / "ci.toml")
    soak = load_manifest(MANIFESTS / "soak-1000.toml")
    assert set(ci.kinds) == set(soak.kinds) == {"kill", "pause", "restart", "disconnect", "disk_full"}
    assert soak.perturbations == 1000 and ci.perturbations <= 12 and ci.min_each * len(ci.kinds) == ci.perturbations
    assert ci.fault_budget == 1 and ci.disk_nodes == ("v3",)


def test_minimal_manifest_defaults_and_disabled_kinds():
    m = parse_manifest(MINIMAL, "t")
    assert m.validators == 7 and m.fault_budget == 2 and m.relays == 0 and m.mode == "auto"
    assert set(m.kinds) == {"kill", "disk_full"}            # weight 0 disables pause
    assert m.kinds["disk_full"].duration == (1.0, 2.0) and m.kinds["disk_full"].targets == ("validator",)
    assert m.kinds["kill"].targets == ("validator", "relay", "compute")


@pytest.mark.parametrize("text, message", [
    ("[perturb.explode]\nweight = 1", "unknown kind"),
    ("[perturb.kill]\nweight = 1\nduration = [3, 1]", "low <= high"),
    ("[perturb.kill]\nweight = 1\ntargets = []", "targets"),
    ("[perturb.disk_full]\nweight = 1", "disk_nodes"),
    ("[network]\ndisk_nodes = [\"v9\"]\n[perturb.kill]\nweight = 1", "disk_nodes"),
    ("[network]\nmode = \"docker\"\n[perturb.kill]\nweight = 1", "network.mode"),
    ("[perturb.kill]\nweight = -1", "weight"),
    ("[perturb.kill]\nweight = 0", "no perturbation kind"),
    ("speed = 3\n[perturb.kill]\nweight = 1", "unknown key"),
    ("[load]\nrate = \"fast\"\n[perturb.kill]\nweight = 1", "load.rate"),
    ("perturbations = [", "not TOML"),
])
def test_bad_manifests_name_the_field(text, message):
    with pytest.raises(ManifestError, match=message):
        parse_manifest(text, "bad")


def test_plan_covers_every_kind_first_then_draws_by_weight_and_replays_by_seed():
    m = parse_manifest(MINIMAL, "t")
    kinds = ["kill", "disk_full"]
    one = plan(m, kinds, random.Random(5))
    assert one == plan(m, kinds, random.Random(5))          # a seed replays the run
    assert len(one) == 30 and sorted(one[:4]) == ["disk_full", "disk_full", "kill", "kill"]
    assert one[4:].count("kill") > one[4:].count("disk_full")


def test_isolation_falls_back_from_namespaces_to_nftables_to_skipping_disconnect():
    from devtools.perturb.__main__ import resolve_mode
    assert resolve_mode("auto", {"netns": None, "nft": None}) == ("netns", False, None)
    assert resolve_mode("loopback", {"netns": None, "nft": None}) == ("loopback", True, None)
    assert resolve_mode("auto", {"netns": "not root", "nft": None}) == ("loopback", True, None)
    mode, nft, why = resolve_mode("auto", {"netns": "not root", "nft": "not root"})
    assert (mode, nft) == ("loopback", False) and "no nftables" in why
    with pytest.raises(ManifestError, match="namespaces unavailable"):
        resolve_mode("netns", {"netns": "ip netns add failed", "nft": None})

"""Issue 22 item 6 (ADR 0192): attacks as soak faults. The unit tests check the attack invariant
(`Watch`) and the attacker's source addresses; the slow one runs every attack of the attacks manifest
against a 4-validator chain under wallet load and wants zero violations. That one fails until the
admission defences (branch `admission`) are merged: the websocket flood takes /health down."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from devtools.perturb import attacks
from devtools.perturb.manifest import load_manifest

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "devtools/perturb/manifests/attacks.toml"
BOMB_MANIFEST = REPO / "devtools/perturb/manifests/attacks-bomb.toml"   # needs a compute node (torch)


class FakeNet:
    """Heights and health as a list of answers per second."""

    def __init__(self, heights, healthy):
        self.validators = [SimpleNamespace(name="v0")]
        self._heights, self._healthy = iter(heights), iter(healthy)

    def height(self, member, timeout=2.0):
        return next(self._heights)

    def healthy(self, member, timeout=2.0):
        return next(self._healthy)


@pytest.fixture
def fast_watch(monkeypatch):
    monkeypatch.setattr(attacks, "STALL_S", 0.25)
    monkeypatch.setattr(attacks, "HEALTH_GRACE_S", 0.25)
    monkeypatch.setattr(attacks.time, "sleep", lambda s: None)
    clock = iter(i * 0.1 for i in range(10_000))
    monkeypatch.setattr(attacks.time, "monotonic", lambda: next(clock))


def test_watch_passes_a_committing_chain_with_a_healthy_victim(fast_watch):
    net = FakeNet(heights=range(1000), healthy=[True] * 1000)
    assert attacks.Watch(net, net.validators[0]).run(2.0) == []


def test_watch_reports_a_stalled_chain_and_a_silent_health_once_each(fast_watch):
    net = FakeNet(heights=[5] * 1000, healthy=[True, True] + [False] * 1000)
    found = attacks.Watch(net, net.validators[0]).run(2.0)
    assert len(found) == 2
    assert "no block committed" in found[0] and "height 5" in found[0]
    assert "v0 /health did not answer" in found[1]


def test_flood_sources_are_distinct_loopback_addresses_apart_from_the_watchers():
    victim = SimpleNamespace(spec=SimpleNamespace(host="127.0.0.1"))
    addrs = attacks.sources(victim, attacks.FLOOD_SOCKETS)
    assert len(set(addrs)) == attacks.FLOOD_SOCKETS and "127.0.0.1" not in addrs
    assert all(a.startswith("127.0.") for a in addrs)
    assert attacks.sources(SimpleNamespace(spec=SimpleNamespace(host="10.9.0.2")), 3) == [None] * 3


def test_the_attacks_manifests_name_every_attack():
    assert set(load_manifest(MANIFEST).kinds) | set(load_manifest(BOMB_MANIFEST).kinds) == set(attacks.ATTACKS)
    assert load_manifest(BOMB_MANIFEST).kinds["pt2_bomb"].targets == ("compute",)


def test_the_bomb_is_refused_by_the_archive_parser_at_once(tmp_path):
    """The soak's bomb is the issue's: the shape expression parser refuses it before torch reads it."""
    import time

    from devtools.perturb.bomb_attack import BOMB_EXPR, bomb_archive
    from ml.train.model_archive import ArchiveRefused, load_archive

    bomb = bomb_archive(tmp_path / "bomb.pt2")
    started = time.monotonic()
    with pytest.raises(ArchiveRefused, match=BOMB_EXPR.replace("*", r"\*")):
        load_archive(bomb)
    assert time.monotonic() - started < 5.0   # refused from the expression, not by running it


@pytest.mark.slow
def test_attack_soak_commits_throughout_and_health_answers():
    """Run after `admission` is merged: ``DEKUBE_SLOW=1 pytest tests/perturb/test_attack_soak.py``."""
    done = subprocess.run([sys.executable, "-m", "devtools.perturb", "--manifest", str(MANIFEST), "--seed", "2",
                           "--keep-going"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["violations"] == [], "\n".join(result["violations"] + done.stderr.splitlines()[-30:])
    assert result["by_kind"] == {kind: 1 for kind in attacks.ATTACKS if kind != "pt2_bomb"}
    assert result["blocks"] > 20


@pytest.mark.slow
def test_pt2_bomb_soak_commits_throughout_and_the_compute_node_answers():
    """The bomb case alone (a compute node in the soak): ``DEKUBE_SLOW=1 pytest ... -k pt2_bomb``."""
    done = subprocess.run([sys.executable, "-m", "devtools.perturb", "--manifest", str(BOMB_MANIFEST), "--seed", "2",
                           "--keep-going"], cwd=REPO, capture_output=True, text=True, timeout=500,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["violations"] == [], "\n".join(result["violations"] + done.stderr.splitlines()[-30:])
    assert result["by_kind"] == {"pt2_bomb": 1}

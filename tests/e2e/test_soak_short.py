"""The CI perturbation manifest: 4 validators and a relay, two of each kind (kill, pause, restart,
disconnect, disk full) under wallet load, every invariant checked after each; zero violations."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ci_manifest_runs_every_kind_without_violations():
    done = subprocess.run([sys.executable, "-m", "devtools.perturb", "--manifest",
                           "devtools/perturb/manifests/ci.toml", "--seed", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.startswith("seed 3 "), done.stdout[:200]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["violations"] == [], "\n".join(result["violations"] + done.stderr.splitlines()[-30:])
    assert done.returncode == 0
    ran = {kind: n for kind, n in result["by_kind"].items()}
    expected = {"kill", "pause", "restart", "disconnect", "disk_full"} - set(result["skipped"])
    assert set(ran) == expected and all(n >= 2 for n in ran.values()), result
    assert result["perturbations"] == sum(ran.values()) == 10
    assert result["confirmed_txs"] > 50 and result["blocks"] > 20

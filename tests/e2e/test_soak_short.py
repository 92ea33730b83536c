"""The soak script in short: 5 kill -9/restarts (and SIGSTOPs) of random validators under load, zero violations."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_short_soak_has_no_invariant_violations():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "soak.py"), "--kills", "5", "--check-every", "5",
                           "--seed", "3"], cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, (result, done.stderr[-2000:])
    assert result["kills"] == 5 and result["violations"] == []
    assert result["confirmed"] > 20
    assert len(set(result["final_heights"])) == 1 or max(result["final_heights"]) - min(result["final_heights"]) <= 2

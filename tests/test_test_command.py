"""The test command (`scripts/test.sh`, which passes its arguments to pytest under pyproject's
[tool.pytest.ini_options]) keeps pytest's summary line: `scripts/test.sh -q` must not turn into `-qq`
(which prints only the dots), so a run ends with "N passed"."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quiet_run_keeps_the_summary_line(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'pytest "$@"' in script   # the arguments reach pytest as given
    out = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                          str(tmp_path), "-p", "no:cacheprovider", "-q", str(tmp_path / "test_one.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout, out.stdout

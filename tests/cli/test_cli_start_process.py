"""End to end: `dekube-node init` then `start` as a real process; /health, SIGTERM/SIGINT -> exit 0;
a 0644 key file is refused with one clear line."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def cli(*argv, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, **kwargs)


def start(home, *argv):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "cli.main", "start", "--home", str(home), *argv], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_lines(stream, sink):
    for line in stream:
        sink.put(line)
    sink.put(None)


def wait_for_log(lines, seen, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        record = json.loads(line)
        if predicate(record):
            return record
    raise AssertionError("log line not seen; output so far:\n" + "".join(seen))


@pytest.fixture
def home(tmp_path):
    result = cli("init", "--home", str(tmp_path / "node"), "--role", "relay", "--insecure-unencrypted-key")
    assert result.returncode == 0, result.stderr
    return tmp_path / "node"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_start_serves_health_and_exits_cleanly_on_signal(home, signum):
    proc = start(home, "--role", "compute,relay", "--rpc-port", "0", "--listen", "/ip4/127.0.0.1/tcp/0",
                 "--log-format", "json")
    lines, seen = queue.Queue(), []
    reader = threading.Thread(target=read_lines, args=(proc.stderr, lines), daemon=True)
    reader.start()
    try:
        url = wait_for_log(lines, seen, lambda r: r["msg"] == "HTTP server listening")["url"]
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    assert resp.status == 200 and json.loads(resp.read()) == {"ok": True}
                    break
            except OSError:
                assert time.monotonic() < deadline, "node never became healthy"
                time.sleep(0.1)
        with urllib.request.urlopen(url + "/status", timeout=2) as resp:
            assert json.loads(resp.read())["roles"] == ["compute", "relay"]
        shown = cli("status", "--url", url)
        assert shown.returncode == 0 and json.loads(shown.stdout)["roles"] == ["compute", "relay"]
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == 0
        wait_for_log(lines, seen, lambda r: r["msg"] == "node stopped", timeout=5)
        assert not any("Traceback" in line for line in seen)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=5)
        proc.stdout.close()
        proc.stderr.close()


def test_status_without_a_running_node(home):
    result = cli("status", "--home", str(home), "--url", "http://127.0.0.1:1")
    assert result.returncode == 1 and "no node answering at http://127.0.0.1:1/status" in result.stderr


def test_version_flag():
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("dekube-node ")


def test_start_refuses_a_world_readable_key(home):
    os.chmod(home / "node_key.json", 0o644)
    result = cli("start", "--home", str(home), "--rpc-port", "0")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "0644" in result.stderr and "chmod 600" in result.stderr and "node_key.json" in result.stderr


def test_start_refuses_a_corrupt_key(home):
    key = home / "node_key.json"
    key.write_text(key.read_text()[:50])
    result = cli("start", "--home", str(home), "--rpc-port", "0")
    assert result.returncode == 1 and "corrupt or truncated" in result.stderr and "Traceback" not in result.stderr

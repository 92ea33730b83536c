"""End to end on a loopback devnet (2 validators, 3 compute node processes, all workers of the task),
as a user does it: the example's own CNN exported to model.pt2 with its train/test .npz files,
``task submit --wait --out`` (dry run, files served from the CLI's client node, live progress from
the workers, payouts, weights fetched); the weights hash to the ledger's result and, evaluated
locally, reproduce the workers' eval metric; ``task fetch`` gets the same bytes again. Failures: a
shape error the workers find themselves (dry run skipped) is rejected on chain with their reason;
``task cancel`` refunds a task no one can take, and one left alone expires with its reason. The
CLI runs as the user runs it: ``python -m cli.main`` processes from the repository root.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from consensus.tx import DEFAULT_FEE
from devtools.devnet import ComputeDevnet
from node.ledger import jsonrpc

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits_cnn.py"
STEPS = 40
ASSIGN_TIMEOUT = 20   # seconds of block time: room to cancel, short enough to watch a task expire


def cli(*argv, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def example(*argv) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLE), *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout


@pytest.fixture(scope="module")
def devnet(tmp_path_factory):
    net = ComputeDevnet.create(tmp_path_factory.mktemp("devnet"), validators=2, compute=3,
                               params={"task_assign_s": ASSIGN_TIMEOUT})
    try:
        net.up(timeout=120)
        yield net
    finally:
        net.down(timeout=5)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("job")
    example("prepare", str(folder))
    return folder


def test_user_model_trained_fetched_checked_and_evaluated(devnet, job):
    from node.artifacts import artifact_id_of_file

    before = json.loads(example("evaluate", str(job), "--json"))
    out = job / "trained"
    done = cli("task", "submit", "--rpc", devnet.rpc_url, "--key", str(devnet.testnet.root / "faucet_key.json"),
               "--model", str(job / "model.pt2"), "--dataset", str(job / "train.npz"), "--eval", str(job / "test.npz"),
               "--loss", "cross_entropy", "--optimizer", "adamw", "--lr", "3e-3", "--batch", "64",
               "--steps", str(STEPS), "--segment-steps", "10", "--workers", "3", "--codec", "int8",
               "--price", "100000", "--wait", "--out", str(out), "--timeout", "300")
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "dry run: one step ran locally" in text
    task_id = re.search(r"task ([0-9a-f]{64}) submitted", text).group(1)
    assert "holds the task's files" in text                      # the owner could go offline from then on
    assert re.search(rf"step {STEPS}/{STEPS}", text), text       # live progress from the workers
    assert "payouts of task" in text and "load them: " in text

    task = jsonrpc.call(devnet.rpc_url, "dkb_getTask", task_id)
    assert task["status"] == "paid" and task["spec"]["model"] == "pt2" and task["sources"]
    weights = out / "weights.safetensors"
    assert artifact_id_of_file(weights) == task["result"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["result"] == task["result"] and metrics["history"]
    reported = metrics["final"]["metrics"]["accuracy"]

    after = json.loads(example("evaluate", str(job), "--weights", str(weights), "--json"))
    assert after["accuracy"] == pytest.approx(reported, abs=0.01)   # the workers' eval metric, reproduced
    assert after["accuracy"] > before["accuracy"] + 30

    again = job / "again"
    fetched = cli("task", "fetch", task_id, "--rpc", devnet.rpc_url, "--out", str(again), "--json")
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(fetched.stdout.strip().splitlines()[-1])["result"] == task["result"]
    assert (again / "weights.safetensors").read_bytes() == weights.read_bytes()

    watched = cli("task", "watch", task_id, "--rpc", devnet.rpc_url)
    assert watched.returncode == 0 and "payouts of task" in watched.stdout


def test_cancel_a_task_no_one_can_take(devnet):
    key = str(devnet.testnet.root / "faucet_key.json")
    owner = devnet.testnet.faucet().peer_id
    submitted = cli("task", "submit", "--rpc", devnet.rpc_url, "--key", key, "--model", "mlp", "--dataset",
                    "digits", "--workers", "8", "--steps", "5", "--price", "5000", "--json")
    assert submitted.returncode == 0, submitted.stderr
    task_id = json.loads(submitted.stdout.strip().splitlines()[-1])["task_id"]
    balance = jsonrpc.call(devnet.rpc_url, "dkb_getBalance", owner)
    escrow = 5000 + jsonrpc.call(devnet.rpc_url, "dkb_getTask", task_id)["spec"].get("audit_surcharge", 0)
    assert escrow > 5000                  # 5 one-step segments: audits above the budget pay on top (ADR 0212)
    cancelled = cli("task", "cancel", task_id, "--rpc", devnet.rpc_url, "--key", key)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout and f"{escrow} tokens back" in cancelled.stdout
    assert jsonrpc.call(devnet.rpc_url, "dkb_getTask", task_id)["status"] == "cancelled"
    assert jsonrpc.call(devnet.rpc_url, "dkb_getBalance", owner) == balance + escrow - DEFAULT_FEE
    again = cli("task", "cancel", task_id, "--rpc", devnet.rpc_url, "--key", key)
    assert again.returncode == 1 and "only a task not assigned yet" in again.stderr


def test_untrainable_files_are_rejected_by_the_workers_and_refunded(devnet, tmp_path):
    """With the local dry run skipped, the workers find the shape error themselves: they reject the task
    on chain with the reason, the owner gets the price back minus the rejection fee."""
    import numpy as np

    from tests.cli.test_task_submit_checks import flat_model_archive

    flat_model_archive(tmp_path / "model.pt2")
    np.savez(tmp_path / "train.npz", x=np.zeros((64, 1, 8, 8), np.float32), y=np.zeros(64, np.int64))
    key = str(devnet.testnet.root / "faucet_key.json")
    done = cli("task", "submit", "--rpc", devnet.rpc_url, "--key", key, "--model", str(tmp_path / "model.pt2"),
               "--dataset", str(tmp_path / "train.npz"), "--steps", "5", "--workers", "3", "--price", "7000",
               "--skip-dry-run", "--wait", "--timeout", "200")
    assert done.returncode == 1, done.stdout + done.stderr
    task_id = re.search(r"task ([0-9a-f]{64}) submitted", done.stdout).group(1)
    task = jsonrpc.call(devnet.rpc_url, "dkb_getTask", task_id)
    assert task["status"] == "rejected" and task["rejections"]
    assert f"task {task_id} rejected" in done.stdout
    assert "rejected by worker" in done.stdout and "cannot" in done.stdout   # the workers' reason, as they gave it
    assert task["payouts"][task["owner"]] > 7000 - 100


def test_a_task_no_one_can_take_expires_with_its_reason(devnet):
    key = str(devnet.testnet.root / "faucet_key.json")
    done = cli("task", "submit", "--rpc", devnet.rpc_url, "--key", key, "--model", "mlp", "--dataset", "digits",
               "--workers", "8", "--steps", "5", "--price", "3000", "--wait", "--timeout", "200")
    assert done.returncode == 1, done.stdout + done.stderr
    task_id = re.search(r"task ([0-9a-f]{64}) submitted", done.stdout).group(1)
    task = jsonrpc.call(devnet.rpc_url, "dkb_getTask", task_id)
    assert task["status"] == "expired" and task["reason"]
    assert f"task {task_id} expired: {task['reason']}" in done.stdout
    assert task["payouts"] == {task["owner"]: 3000 + task["spec"].get("audit_surcharge", 0)}   # all of the escrow


def test_watch_follows_a_running_task_live_from_its_workers(devnet):
    key = str(devnet.testnet.root / "faucet_key.json")
    submitted = cli("task", "submit", "--rpc", devnet.rpc_url, "--key", key, "--model", "mlp", "--dataset", "digits",
                    "--workers", "3", "--steps", "60", "--segment-steps", "10", "--price", "9000", "--json")
    assert submitted.returncode == 0, submitted.stderr
    task_id = json.loads(submitted.stdout.strip().splitlines()[-1])["task_id"]
    watched = cli("task", "watch", task_id, "--rpc", devnet.rpc_url, "--timeout", "200")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    steps = [int(m) for m in re.findall(r"step (\d+)/60", watched.stdout)]
    assert steps and steps[-1] == 60 and steps == sorted(steps)   # reports as the workers trained
    assert "payouts of task" in watched.stdout and "result (weights artifact): " in watched.stdout

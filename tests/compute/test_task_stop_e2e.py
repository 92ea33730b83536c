"""Issue 23 item 2's stop end to end (docs/adr/0211): on a local devnet (1 validator, 3 compute node
processes) a task cut into 3 epochs is stopped by its owner with `dekube-node task stop` as soon as it is
assigned; it ends at the boundary the CLI names (after epoch 1, or 2 if the crew was that quick; status
``stopped``, the reason saying so), the closed epochs are audited and paid, the rest of the escrow goes
back to the owner, and `task fetch` (and `task fetch --epoch N`) write the model weights of that epoch's
state, which load into the task's model."""
import json
import subprocess
import sys
import time

import pytest

from devtools.devnet import ComputeDevnet
from ml.train.spec import TrainSpec
from node.ledger import jsonrpc
from tests.cli.test_operator_path import REPO
from tests.compute.test_task_epochs_e2e import PRICE, submit_epoch_task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

SPEC = TrainSpec(codec="int8", steps=600, segment_steps=20)   # 30 segments: 3 epochs of 10
PER_EPOCH = 10
EPOCHS, EXPECTED_S = 3, 40


def rpc(net, method, *params):
    return jsonrpc.call(net.rpc_url, method, *params)


def cli(*args):
    done = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_owner_stops_a_run_after_epoch_one_and_fetches_its_weights(tmp_path):
    from safetensors.torch import load_file

    from ml.registry import build_model, get_dataset

    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=3)
    try:
        net.up(timeout=120)
        task_id = submit_epoch_task(net, SPEC, 2, EXPECTED_S, EPOCHS)
        said = json.loads(cli("task", "stop", task_id, "--rpc", net.rpc_url, "--key", str(net.testnet.faucet_key),
                              "--json"))
        last = said["stops_after_epoch"]
        assert last in (1, 2) and said["epochs"] == EPOCHS, said

        deadline = time.monotonic() + 300
        while (task := rpc(net, "dkb_getTask", task_id))["status"] not in ("paid", "stopped", "expired", "failed"):
            assert time.monotonic() < deadline, task
            time.sleep(0.5)
        assert task["status"] == "stopped", task
        assert f"stopped by its owner at the end of epoch {last}" in task["reason"], task
        assert all(c[2] == PER_EPOCH * last for c in task["commits"].values()), task["commits"]
        assert all(slot["segment"] < PER_EPOCH * last for slot in task["slots"])
        escrowed = PRICE + task["spec"].get("audit_surcharge", 0)   # each epoch audited on its own (ADR 0230)
        payouts = task["payouts"]
        assert sum(payouts.values()) == escrowed and payouts[task["owner"]] > PRICE // 2, payouts

        fetched = json.loads(cli("task", "fetch", task_id, "--out", str(tmp_path / "last"), "--rpc", net.rpc_url,
                                 "--json"))
        assert fetched["epoch"] == last and fetched["result"] in {c[1] for c in task["commits"].values()}, fetched
        again = json.loads(cli("task", "fetch", task_id, "--epoch", str(last), "--out", str(tmp_path / "one"),
                               "--rpc", net.rpc_url, "--json"))
        assert again["epoch"] == last
        model = build_model("digits-mlp", get_dataset("digits"), 0)
        weights = load_file(str(tmp_path / "last" / "weights.safetensors"))
        model.load_state_dict(weights)   # strict: every tensor of the task's model, nothing else
        assert all(weights[k].equal(v) for k, v in load_file(str(tmp_path / "one" / "weights.safetensors")).items())
    finally:
        net.down(timeout=5)

"""Issue 23 item 2 end to end (docs/adr/0203): on a local devnet (1 validator, 4 compute node processes), a
task cut into 3 epochs is trained by a crew of 3; each worker commits its progress (commit_epoch: the
root of its segment records so far and its state digest) as its training reaches each epoch's end. A
worker is SIGKILLed right after committing epoch 1, in epoch 2: the others go on, the epoch closes at its
deadline without it, the survivors commit the result, and the ledger holds the dead worker to its
epoch-1 commitment: its audit slots were drawn from that epoch's segments as it closed (ADR 0230: judged
ok, or unaudited once its verifiers cannot reach it: not slashed either way), the survivors are audited
epoch by epoch and paid their full share, and the two epochs the dead worker did not work go back to the
owner. Before ADR 0203 there is no
``epochs`` field nor ``commit_epoch``: the submit itself is refused."""
import time

import pytest

from consensus.genesis import Params
from consensus.state.tasks import task_id_for, worker_share
from consensus.tx import build_tx
from devtools.devnet import ComputeDevnet
from ml.compute.task_spec import submit_payload
from ml.profiles import portable_cpu_profile, torch_release
from ml.train.spec import TrainSpec
from node.ledger import jsonrpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

SPEC = TrainSpec(codec="int8", steps=240, segment_steps=20)   # 12 segments: 3 epochs of 4
EPOCHS, PRICE, EXPECTED_S = 3, 100_000, 30


def rpc(net, method, *params):
    return jsonrpc.call(net.rpc_url, method, *params)


def submit_epoch_task(net, spec: TrainSpec, workers: int, expected_s: int, epochs: int = EPOCHS,
                      **extra) -> str:
    """The faucet submits ``spec`` cut into ``epochs`` for ``workers`` (and ``extra`` payload fields); the
    task id once it is assigned."""
    payload = {**submit_payload(spec, workers, PRICE, portable_cpu_profile(torch_release())),
               "expected_s": expected_s, "epochs": epochs, **extra}
    faucet = net.testnet.faucet()
    nonce = rpc(net, "dkb_getTransactionCount", faucet.peer_id, "pending")
    rpc(net, "dkb_sendRawTransaction", build_tx(faucet, net.testnet.chain_id, nonce, "submit_task", payload).raw.hex())
    task_id = task_id_for(faucet.peer_id, nonce).hex()
    deadline = time.monotonic() + 120
    while not (rpc(net, "dkb_getTask", task_id) or {}).get("workers"):
        assert time.monotonic() < deadline, rpc(net, "dkb_getTask", task_id)
        time.sleep(0.1)
    return task_id


def test_a_crew_runs_three_epochs_and_a_worker_dies_in_epoch_two(tmp_path):
    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=4)
    try:
        net.up(timeout=120)
        task_id = submit_epoch_task(net, SPEC, 3, EXPECTED_S)
        deadline = time.monotonic() + 120
        workers = rpc(net, "dkb_getTask", task_id)["workers"]
        victim = next(n for n in net.compute if n.peer_id == workers[-1])
        bonded = rpc(net, "dkb_getStake", victim.peer_id)["bonded"]
        while not rpc(net, "dkb_getTask", task_id)["epochs"].get("commits", {}).get(victim.peer_id):
            assert time.monotonic() < deadline + 120, rpc(net, "dkb_getTask", task_id)
            time.sleep(0.05)
        net.testnet.kill_node(victim)   # in epoch 2, its epoch-1 progress on the ledger

        deadline, task = time.monotonic() + 360, None
        while time.monotonic() < deadline:
            task = rpc(net, "dkb_getTask", task_id)
            if task["status"] in ("paid", "expired", "failed", "rejected"):
                break
            time.sleep(0.5)
        assert task is not None and task["status"] == "paid", task
        survivors = [w for w in workers if w != victim.peer_id]
        progress = task["epochs"]["commits"]
        assert len(progress[victim.peer_id]) == 1 and progress[victim.peer_id][0][2] == 4, progress
        assert all(len(progress[w]) == EPOCHS - 1 and [e[2] for e in progress[w]] == [4, 8] for w in survivors)
        assert task["epochs"]["current"] == EPOCHS - 1 and "stopped" not in task["epochs"]
        assert {w: c[2] for w, c in task["commits"].items()} == {**{w: 12 for w in survivors}, victim.peer_id: 4}
        victim_slots = [s for s in task["slots"] if s["worker"] == victim.peer_id]
        # its epoch-1 slots were drawn as that epoch closed (ADR 0230): judged ok if a verifier fetched its
        # record before the kill, else unaudited (unreachable and gone); never guilty
        assert victim_slots and all(s["segment"] < 4 and s["epoch"] == 0 for s in victim_slots)
        assert all(s["outcome"] in ("ok", "unaudited") for s in victim_slots), victim_slots
        assert all(s["outcome"] == "ok" for s in task["slots"] if s["worker"] != victim.peer_id), task["slots"]
        assert all({s["epoch"] for s in task["slots"] if s["worker"] == w} == {0, 1, 2} for w in survivors)
        assert task["epochs"]["released"] == [0, 1, 2]   # each epoch paid out once its slots resolved
        share = worker_share(Params(), PRICE, 3)
        for worker in survivors:   # full share, plus what it earned as a verifier of the others
            assert task["payouts"][worker] >= share and task["epochs"]["earned"][worker] == share
        assert task["epochs"].get("earned", {}).get(victim.peer_id, 0) <= share // EPOCHS   # at most epoch 1
        assert rpc(net, "dkb_getStake", victim.peer_id)["bonded"] == bonded     # a crash is not a slash
        assert task["payouts"][task["owner"]] >= share                           # its unworked epochs came back
        supply = rpc(net, "dkb_getSupply")
        assert supply["total"] == supply["genesis"], supply
    finally:
        net.down(timeout=5)

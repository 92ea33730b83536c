"""Issue 23 item 3 end to end (docs/adr/0226): on a local devnet (1 validator, 4 compute node processes) a
task cut into 6 epochs is trained by a crew of 3; a worker is SIGKILLed in epoch 2, the epoch closes
without it, and the ledger names the fourth node to its seat from a later epoch. The joiner fetches a
member's committed state (checked against its digest), the members take it into their all-reduce group at
that epoch's first round, and it trains the dead worker's seat to the end. The task is paid: the survivors
their full share, the joiner the epochs it covered, the dead worker nothing (its slots unaudited, not
slashed), the rest back to the owner. Before ADR 0226 the seat stayed empty: no worker_joined, the fourth
node never trained."""
import time

import pytest
from test_task_epochs_e2e import rpc, submit_epoch_task

from consensus.genesis import Params
from consensus.state.tasks import worker_share
from devtools.devnet import ComputeDevnet
from ml.train.spec import TrainSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = TrainSpec(codec="int8", steps=960, segment_steps=80)   # 12 segments: 6 epochs of 2
EPOCHS, PRICE, EXPECTED_S = 6, 100_000, 30
# epoch deadlines of 4 x 5 s + 6 s: the epoch a worker dies in closes ~7 s after the survivors committed it,
# while they train on (a joiner enters one epoch past their furthest commitment, so some epochs remain)
PARAMS = {"task_min_s": 12, "task_slack_s": 6}


def test_a_worker_killed_mid_run_is_replaced_and_the_joiner_is_paid_for_its_epochs(tmp_path):
    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=4, params=PARAMS)
    try:
        net.up(timeout=120)
        task_id = submit_epoch_task(net, SPEC, 3, EXPECTED_S, epochs=EPOCHS)
        workers = rpc(net, "dkb_getTask", task_id)["workers"]
        spare = next(n for n in net.compute if n.peer_id not in workers)
        victim = next(n for n in net.compute if n.peer_id == workers[-1])
        bonded = rpc(net, "dkb_getStake", victim.peer_id)["bonded"]
        deadline = time.monotonic() + 240
        while not rpc(net, "dkb_getTask", task_id)["epochs"].get("commits", {}).get(victim.peer_id):
            assert time.monotonic() < deadline, rpc(net, "dkb_getTask", task_id)
            time.sleep(0.05)
        net.testnet.kill_node(victim)   # in epoch 2, its epoch-1 progress on the ledger

        deadline, task = time.monotonic() + 420, None
        while time.monotonic() < deadline:
            task = rpc(net, "dkb_getTask", task_id)
            if task["status"] in ("paid", "stopped", "expired", "failed", "rejected"):
                break
            time.sleep(0.5)
        assert task is not None and task["status"] == "paid", {k: task[k] for k in ("status", "reason", "epochs",
                                                                                   "slots", "commits", "workers")}
        joined = task["epochs"].get("joined", {})
        assert list(joined) == [spare.peer_id], task["epochs"]
        seat, first = joined[spare.peer_id]
        assert seat == sorted(workers).index(victim.peer_id) and 2 < first < EPOCHS, joined
        assert task["workers"] == [*workers, spare.peer_id]
        progress = task["epochs"]["commits"]
        per_epoch = 12 // EPOCHS
        expected = [per_epoch * (e + 1) for e in range(first, EPOCHS - 1)]   # its epochs, its layout's ends
        assert [e[2] for e in progress.get(spare.peer_id, [])] == expected
        assert task["commits"][spare.peer_id][2] == 12 and task["commits"][victim.peer_id][2] == per_epoch
        spare_slots = [s for s in task["slots"] if s["worker"] == spare.peer_id]
        assert spare_slots and all(s["segment"] >= first * per_epoch and s["outcome"] == "ok" for s in spare_slots)
        assert all(s["outcome"] == "ok" for s in task["slots"] if s["worker"] != victim.peer_id), task["slots"]
        share = worker_share(Params(), PRICE, 3)
        for worker in workers:
            if worker != victim.peer_id:   # full share, plus what it earned as a verifier of the others
                assert task["payouts"][worker] >= share
        assert task["payouts"][spare.peer_id] >= share * (EPOCHS - first) // EPOCHS
        assert victim.peer_id not in task["payouts"]
        assert rpc(net, "dkb_getStake", victim.peer_id)["bonded"] == bonded
        supply = rpc(net, "dkb_getSupply")
        assert supply["total"] == supply["genesis"], supply
    finally:
        net.down(timeout=5)

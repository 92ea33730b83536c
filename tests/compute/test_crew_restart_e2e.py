"""Issue 23 item 3, last sentence, end to end (docs/adr/0232): on a local devnet (1 validator, 6 compute node
processes) a task cut into 3 epochs is trained by a crew of 3; once epoch 1 closed, every worker is
SIGKILLed. The open epoch's deadline passes with no commitment, and instead of stopping the task the ledger
names the other three nodes to the seats from that epoch on. They find no live holder of the committed
state and keep asking; one former worker is started again with its home and serves the state it committed
from disk; the new crew fetches it (checked against its digest), trains epochs 2 and 3 and the task is paid:
the new crew for its two epochs, the restarted former worker for the one it committed, the two dead ones
nothing (unaudited, not slashed), the rest back to the owner. Before ADR 0232 the task stopped after epoch 1."""
import time

import pytest
from test_task_epochs_e2e import rpc, submit_epoch_task

from consensus.genesis import Params
from consensus.state.tasks import worker_share
from devtools.devnet import ComputeDevnet
from ml.compute.training import JOINER_WAITS_FOR_HOLDER
from ml.train.spec import TrainSpec
from node.ledger import jsonrpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = TrainSpec(codec="int8", steps=960, segment_steps=80)   # 12 segments: 3 epochs of 4
EPOCHS, PRICE, EXPECTED_S = 3, 100_000, 30
# epoch deadlines of 4 x 10 s + 60 s: room for a new crew to start, wait for a holder and train an epoch
PARAMS = {"task_min_s": 12, "task_slack_s": 60}
ENDED = ("paid", "stopped", "expired", "failed", "rejected")


def wait_for(net, task_id, condition, seconds):
    deadline, task = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        task = rpc(net, "dkb_getTask", task_id)
        if condition(task):
            return task
        time.sleep(0.1)
    raise AssertionError({k: task[k] for k in ("status", "reason", "epochs", "workers")} if task else task_id)


def wait_for_joiner(net, spares, task_id, seconds):
    """A joiner of the new crew that found no holder of the state (its job says so); its peer ID."""
    nodes = [n for n in net.compute if n.peer_id in spares]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node in nodes:
            try:
                job = jsonrpc.call(node.rpc_url, "dkb_taskProgress", task_id)
            except Exception:   # no job yet
                continue
            if job.get("state") == JOINER_WAITS_FOR_HOLDER:
                return node.peer_id
        time.sleep(0.5)
    raise AssertionError("no joiner reported waiting for a holder of the state")


def test_a_crew_killed_to_the_last_worker_resumes_on_a_new_crew_and_is_paid(tmp_path):
    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=6, params=PARAMS)
    try:
        net.up(timeout=180)
        task_id = submit_epoch_task(net, SPEC, 3, EXPECTED_S, epochs=EPOCHS)
        workers = rpc(net, "dkb_getTask", task_id)["workers"]
        crew = [n for n in net.compute if n.peer_id in workers]
        spares = sorted(n.peer_id for n in net.compute if n.peer_id not in workers)
        wait_for(net, task_id, lambda t: t["epochs"].get("current", 0) >= 1, 240)
        for node in crew:   # every member dies in epoch 2
            net.testnet.kill_node(node)
        bonded = {n.peer_id: rpc(net, "dkb_getStake", n.peer_id)["bonded"] for n in crew}

        task = wait_for(net, task_id, lambda t: t["epochs"].get("restarts") or t["status"] in ENDED, 180)
        assert task["epochs"].get("restarts") == 1, {k: task[k] for k in ("status", "reason", "epochs")}
        joined = task["epochs"]["joined"]
        assert sorted(joined) == spares and all(first == 1 for _, first in joined.values()), joined
        waiting = wait_for_joiner(net, spares, task_id, 120)   # no holder of the state is alive: it asks again
        holder = crew[0]
        net.start_compute(holder)   # a former worker comes back with its home: it serves its epoch-1 state

        task = wait_for(net, task_id, lambda t: t["status"] in ENDED, 360)
        assert task["status"] == "paid", {k: task[k] for k in ("status", "reason", "epochs", "slots", "commits")}
        assert task["epochs"]["restarts"] == 1 and task["workers"][:3] == workers and waiting in spares
        for spare in spares:   # the new crew committed epoch 2 and the result
            assert [e[2] for e in task["epochs"]["commits"][spare]] == [8] and task["commits"][spare][2] == 12
        share = worker_share(Params(), PRICE, 3)
        for spare in spares:
            assert task["payouts"][spare] >= share * 2 // EPOCHS
        assert task["commits"][holder.peer_id][2] == 4   # held to its epoch-1 commitment
        assert task["payouts"].get(holder.peer_id, 0) >= share // EPOCHS
        for node in crew[1:]:
            assert node.peer_id not in task["payouts"]
            assert rpc(net, "dkb_getStake", node.peer_id)["bonded"] == bonded[node.peer_id]
        supply = rpc(net, "dkb_getSupply")
        assert supply["total"] == supply["genesis"], supply
    finally:
        net.down(timeout=5)

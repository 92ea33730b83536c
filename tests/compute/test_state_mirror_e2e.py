"""A crew that died for good resumes from a verifier's copy of its state (docs/adr/0236), end to end: on a
local devnet (1 validator, 6 compute node processes) a task cut into 3 epochs is trained by a crew of 3. Once
epoch 1 closed and a node outside the crew, drawn to audit it, mirrors its committed state, every worker is
SIGKILLed and none ever comes back. The ledger restarts the open epoch on the three free nodes (ADR 0232);
they get epoch 1's state from the mirror (checked against the committed digest), train epochs 2 and 3 and
the task is paid. Before ADR 0236 only the dead workers held that state: the new crew waited for them until
its epoch's deadline and the task stopped after epoch 1."""
import time

import pytest
from test_crew_restart_e2e import ENDED, wait_for
from test_task_epochs_e2e import rpc, submit_epoch_task

from devtools.devnet import ComputeDevnet
from ml.compute.job_board import JobState
from ml.train.spec import TrainSpec
from node.ledger import jsonrpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = TrainSpec(codec="int8", steps=2400, segment_steps=80)   # 30 segments: 3 epochs of 10 (~30 s each here)
EPOCHS, EXPECTED_S = 3, 75
PARAMS = {"task_min_s": 12, "task_slack_s": 30}


def mirroring(net, spares, task_id) -> str | None:
    """A node outside the crew that keeps a copy of the task's epoch state (its job says so)."""
    for node in net.compute:
        if node.peer_id in spares:
            try:
                job = jsonrpc.call(node.rpc_url, "dkb_taskProgress", task_id)
            except Exception:   # no job of that task
                continue
            if job.get("state") == JobState.MIRRORING and job.get("epoch_states"):
                return node.peer_id
    return None


def test_a_dead_crew_resumes_from_a_verifiers_copy_of_its_last_state(tmp_path):
    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=6, params=PARAMS)
    try:
        net.up(timeout=180)
        task_id = submit_epoch_task(net, SPEC, 3, EXPECTED_S, epochs=EPOCHS)
        workers = rpc(net, "dkb_getTask", task_id)["workers"]
        crew = [n for n in net.compute if n.peer_id in workers]
        spares = sorted(n.peer_id for n in net.compute if n.peer_id not in workers)
        wait_for(net, task_id, lambda t: t["epochs"].get("current", 0) >= 1, 300)
        deadline, mirror = time.monotonic() + 60, None
        while mirror is None:
            assert time.monotonic() < deadline, "no node outside the crew mirrored epoch 1's state"
            mirror = mirroring(net, spares, task_id)
            time.sleep(0.2)
        assert rpc(net, "dkb_getTask", task_id)["epochs"]["current"] == 1, "epoch 2 closed before the kill"
        for node in crew:   # every member dies in epoch 2, for good
            net.testnet.kill_node(node)

        task = wait_for(net, task_id, lambda t: t["status"] in ENDED, 600)
        assert task["status"] == "paid", {k: task[k] for k in ("status", "reason", "epochs", "slots", "commits")}
        assert task["epochs"].get("restarts") == 1
        assert sorted(task["epochs"]["joined"]) == spares and mirror in spares
        for spare in spares:   # the new crew started from the mirrored state and committed epoch 2 and the result
            assert [e[2] for e in task["epochs"]["commits"][spare]] == [20] and task["commits"][spare][2] == 30
        state = task["epochs"]["commits"][workers[0]][0][1]
        assert all(task["epochs"]["commits"][w][0][1] == state for w in workers)   # the state they resumed from
        supply = rpc(net, "dkb_getSupply")
        assert supply["total"] == supply["genesis"], supply
    finally:
        net.down(timeout=5)

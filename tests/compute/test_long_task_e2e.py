"""Issue 23, item 1, end to end (docs/adr/0187): on a local devnet (1 validator, 3 compute node processes)
whose blocks come ten times as fast as the default (``consensus.empty_block_wait`` 0.03 s instead of
0.3 s), whose validator keeps only the last 100 blocks (pruning, docs/adr/0214), and with a CPU hog
running beside it, a task whose training spans far more than 200 blocks is
committed, audited and paid. The submitter declares the expected duration the way ``task submit``
does (its dry run's step time x steps); the ledger's commit deadline is a block time derived from it,
so the block rate cannot cut the workers off (before, a fixed 200-block deadline did: ``commit_result:
bad_state commit deadline has passed``, the owner refunded and the task shown ``paid``)."""
import multiprocessing
import time

import pytest

from cli.task_submit import expected_seconds
from consensus.state.tasks import task_id_for
from consensus.tx import build_tx
from devtools.devnet import ComputeDevnet
from ml.compute.task_spec import submit_payload
from ml.profiles import portable_cpu_profile, torch_release
from ml.train.dry_run import dry_run
from ml.train.spec import TrainSpec
from node.ledger import jsonrpc
from node.ledger.errors import RpcAnswerError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SPEC = TrainSpec(codec="int8", steps=600, segment_steps=150)
PRICE = 100_000
# ~10x the default block rate (0.3 s), and the validator keeps only the last 100 blocks (the smallest
# retention: docs/adr/0214): the task's audits and payment must not need a block it pruned
FAST_BLOCKS = {"consensus.empty_block_wait": "0.03", "consensus.retain_blocks": "100"}
OLD_DEADLINE_BLOCKS = 200


def hog(stop) -> None:
    """A busy loop beside the devnet (the user's busy machine), until ``stop`` is set."""
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def rpc(net, method, *params):
    return jsonrpc.call(net.rpc_url, method, *params)


def test_a_task_longer_than_200_fast_blocks_is_paid(tmp_path):
    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=3, validator_settings=FAST_BLOCKS)
    stop = multiprocessing.Event()
    cpu_hog = multiprocessing.Process(target=hog, args=(stop,), daemon=True)
    try:
        net.up(timeout=120)
        cpu_hog.start()
        payload = submit_payload(SPEC, 3, PRICE, portable_cpu_profile(torch_release()))
        payload["expected_s"] = expected_seconds(dry_run(SPEC)["step_seconds"], SPEC.steps)   # as `task submit`
        faucet = net.testnet.faucet()
        nonce = rpc(net, "dkb_getTransactionCount", faucet.peer_id, "pending")
        rpc(net, "dkb_sendRawTransaction",
            build_tx(faucet, net.testnet.chain_id, nonce, "submit_task", payload).raw.hex())
        task_id = task_id_for(faucet.peer_id, nonce).hex()
        deadline, task = time.monotonic() + 300, None
        while time.monotonic() < deadline:
            task = rpc(net, "dkb_getTask", task_id)
            if task is not None and task["status"] in ("paid", "expired", "failed", "rejected"):
                break
            time.sleep(0.5)
        assert task is not None and task["status"] == "paid", task
        assert task["spec"]["expected_s"] == payload["expected_s"]
        first_commit = min(commit[3] for commit in task["commits"].values())
        assert first_commit - task["assigned_height"] > OLD_DEADLINE_BLOCKS, task   # the old deadline: lost
        assert sorted(task["commits"]) == sorted(task["workers"])
        assert all(task["payouts"].get(worker, 0) > 0 for worker in task["workers"]), task["payouts"]
        assert task["reason"] == ""
        # audited and paid while the validator pruned: the blocks of its assignment are long gone
        with pytest.raises(RpcAnswerError, match="pruned"):
            rpc(net, "dkb_getBlockByNumber", task["assigned_height"])
    finally:
        stop.set()
        if cpu_hog.is_alive():
            cpu_hog.join(timeout=5)
        net.down(timeout=5)

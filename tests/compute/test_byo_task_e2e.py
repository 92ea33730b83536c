"""End to end on a local devnet (2 validators + 4 compute node processes) with the owner's own model: the
owner's node holds a .pt2 archive and an .npz dataset, submits a task naming them with its addresses
as `sources` (and the portable CPU profile, as the CLI does); the 3 workers fetch them, train, commit
the weights' artifact id; the ledger-drawn verifiers replay a drawn segment of each worker (fetching
the inputs too) and every audit slot ends ok; the owner follows a worker's progress live over
/dekube/task-progress/1.0.0 and fetches the weights from the workers, checking them against the
ledger's result. An untrainable task (the dataset does not fit the model) is rejected by the workers
with the reason and refunded minus the reject fee, with no reputation lost; a worker killed mid-task
does not stop the others' weights from being delivered.
"""
import asyncio
import time

import numpy as np
import pytest
from safetensors.torch import load_file

from cli.client_node import client_node
from consensus.genesis import Params
from consensus.state.tasks import task_id_for
from consensus.tx import build_tx
from devtools.devnet import ComputeDevnet
from ml.compute.progress_protocol import follow_progress
from ml.compute.task_spec import submit_payload
from ml.train.spec import TrainSpec
from node.artifacts import artifact_id_of_file
from node.ledger import jsonrpc
from tests.compute.test_task_flow_e2e import PROFILE, balance_plus_fees, http_json, wait_for_step
from tests.ml.byo import digits_cnn_archive, digits_npz

pytestmark = pytest.mark.timeout(420)

PRICE = 100_000
PARAMS = {"verifier_share_bps": 500, "relay_share_bps": 1_000, "slash_mismatch_bps": 1_000}


@pytest.fixture(scope="module")
def devnet(tmp_path_factory):
    net = ComputeDevnet.create(tmp_path_factory.mktemp("devnet"), validators=2, compute=4, params=PARAMS)
    try:
        net.up(timeout=120)
        yield net
    finally:
        net.down(timeout=5)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("byo")
    x = np.random.default_rng(0).random((64, 10), dtype=np.float32)   # 10 features: the CNN wants 64
    with open(folder / "wrong.npz", "wb") as f:
        np.savez(f, x=x, y=np.zeros(64, dtype=np.int64))
    return digits_cnn_archive(folder / "cnn.pt2"), digits_npz(folder / "digits.npz"), folder / "wrong.npz"


def rpc(net, method, *params):
    return jsonrpc.call(net.rpc_url, method, *params)


def owner_sources(node) -> list[str]:
    return [addr if "/p2p/" in addr else f"{addr}/p2p/{node.peer_id}"
            for addr in node.host.listen_addrs if "/0.0.0.0/" not in addr]


async def submit(net, node, spec: TrainSpec) -> str:
    faucet = net.testnet.faucet()
    nonce = rpc(net, "dkb_getTransactionCount", faucet.peer_id, "pending")
    payload = {**submit_payload(spec, 3, PRICE, PROFILE), "sources": owner_sources(node)}
    tx = build_tx(faucet, net.testnet.chain_id, nonce, "submit_task", payload)
    rpc(net, "dkb_sendRawTransaction", tx.raw.hex())
    return task_id_for(faucet.peer_id, nonce).hex()


async def wait_status(net, task_id: str, statuses: tuple[str, ...], timeout: float = 200) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = await asyncio.to_thread(rpc, net, "dkb_getTask", task_id)
        if task is not None and task["status"] in statuses:
            return task
        await asyncio.sleep(0.3)
    raise AssertionError(f"task not {statuses} in {timeout} s: {rpc(net, 'dkb_getTask', task_id)}")


async def wait_workers(net, task_id: str) -> list[str]:
    deadline = time.monotonic() + 60
    while not (task := await asyncio.to_thread(rpc, net, "dkb_getTask", task_id) or {}).get("workers"):
        assert time.monotonic() < deadline, "task not assigned"
        await asyncio.sleep(0.2)
    return task["workers"]


def learn(net, node, peers: list[str]) -> None:
    for peer in peers:
        info = rpc(net, "dkb_getNode", peer)
        node.host.peerbook.add_addrs(peer, info["listen_addrs"])


def byo_spec(model_id: str, dataset_id: str, **extra) -> TrainSpec:
    return TrainSpec(model="pt2", model_artifact=model_id, dataset="file", dataset_artifact=dataset_id,
                     loss="cross_entropy", codec="int8", batch_size=32, lr=3e-3, **extra)


def test_own_model_trained_weights_fetched_and_progress_followed(devnet, inputs):
    archive, dataset, _ = inputs

    async def scenario():
        async with client_node(devnet.testnet.faucet(), listen="/ip4/127.0.0.1/tcp/0") as owner:
            spec = byo_spec(await owner.artifacts.add_file(archive), await owner.artifacts.add_file(dataset),
                            steps=40, segment_steps=10, report_every=5)
            task_id = await submit(devnet, owner, spec)
            workers = await wait_workers(devnet, task_id)
            learn(devnet, owner, workers)
            updates = [u async for u in follow_progress(owner.host, workers[0], bytes.fromhex(task_id))]
            task = await wait_status(devnet, task_id, ("paid",))
            path = await owner.artifacts.fetch(task["result"], workers)
            return spec, task, updates, artifact_id_of_file(path), load_file(str(path))

    spec, task, updates, fetched_id, weights = asyncio.run(scenario())
    assert len(task["commits"]) == 3 and len(task["slots"]) == 3 * 2   # audits_per_worker slots per worker
    assert all(slot["outcome"] == "ok" for slot in task["slots"]), task["slots"]
    assert {slot["worker"] for slot in task["slots"]} == set(task["workers"])
    assert {commit[1] for commit in task["commits"].values()} == {task["result"]}   # all agree on the weights
    assert fetched_id == task["result"]
    assert set(weights) == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}   # loads into the owner's model
    states = [u["state"] for u in updates]
    assert states[-1] == "committed" and updates[-1]["result"] == task["result"]
    assert any(u["state"] == "training" and u["step"] > 0 for u in updates)
    assert updates[-1]["step"] == spec.steps and updates[-1]["bytes_sent"] > 0
    worker = next(n for n in devnet.compute if n.peer_id == task["workers"][0])
    job = http_json(f"{worker.rpc_url}/status")["compute"]["jobs"][task["task_id"]]
    assert job["fetch_total"] > 0 and job["fetched_bytes"] == job["fetch_total"]
    assert job["metrics"]["accuracy"] > 50


def test_untrainable_task_rejected_refunded_and_no_reputation_lost(devnet, inputs):
    archive, _, wrong = inputs
    faucet = devnet.testnet.faucet().peer_id

    async def scenario():
        async with client_node(devnet.testnet.faucet(), listen="/ip4/127.0.0.1/tcp/0") as owner:
            spec = byo_spec(await owner.artifacts.add_file(archive), await owner.artifacts.add_file(wrong), steps=10)
            before = balance_plus_fees(devnet, faucet)
            reputations = {n.peer_id: rpc(devnet, "dkb_getNode", n.peer_id)["reputation"] for n in devnet.compute}
            task_id = await submit(devnet, owner, spec)
            task = await wait_status(devnet, task_id, ("rejected", "paid", "expired"))
            return task, before, reputations

    task, before, reputations = asyncio.run(scenario())
    assert task["status"] == "rejected", task
    assert len(task["rejections"]) >= 2 and all("Untrainable" in r for r in task["rejections"].values())
    assert "cannot run" in task["reason"] or "shape" in task["reason"]
    assert balance_plus_fees(devnet, faucet) - before == -Params().reject_fee   # refunded minus the fee
    for node in devnet.compute:
        assert rpc(devnet, "dkb_getNode", node.peer_id)["reputation"] == reputations[node.peer_id]
        deadline = time.monotonic() + 60   # the last worker may still be in its dry run
        while (job := http_json(f"{node.rpc_url}/status")["compute"]["jobs"].get(task["task_id"])) is not None \
                and job["state"] not in ("rejected", "failed", "committed") and time.monotonic() < deadline:
            time.sleep(0.3)
        assert job is None or job["state"] == "rejected", job


def test_worker_killed_mid_task_the_others_weights_are_delivered(devnet, inputs):
    # Last in this module: it leaves a compute node dead.
    archive, dataset, _ = inputs

    async def scenario():
        async with client_node(devnet.testnet.faucet(), listen="/ip4/127.0.0.1/tcp/0") as owner:
            spec = byo_spec(await owner.artifacts.add_file(archive), await owner.artifacts.add_file(dataset),
                            steps=100, segment_steps=10)
            task_id = await submit(devnet, owner, spec)
            workers = await wait_workers(devnet, task_id)
            victim = next(n for n in devnet.compute if n.peer_id == workers[-1])
            await asyncio.to_thread(wait_for_step, victim, task_id, 10)
            devnet.testnet.kill_node(victim)
            task = await wait_status(devnet, task_id, ("paid",), timeout=300)
            survivors = [w for w in workers if w != victim.peer_id]
            learn(devnet, owner, survivors)
            path = await owner.artifacts.fetch(task["result"], survivors)
            return task, survivors, artifact_id_of_file(path)

    task, survivors, fetched_id = asyncio.run(scenario())
    assert sorted(task["commits"]) == survivors
    assert fetched_id == task["result"]
    assert {commit[1] for commit in task["commits"].values()} == {task["result"]}

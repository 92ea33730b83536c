"""End to end on a local devnet (2 validators + 4 compute node processes running the portable CPU
profile): a digits task is assigned to 3 workers, trained with an int8 all-reduce over the nodes' p2p
Host and committed; the ledger draws `audits_per_worker` audit slots per worker (docs/adr/0168), the
drawn verifiers replay their slot's segment and answer with evidence, every slot ends ok and the task
is paid from escrow. Then a worker restarted to commit falsified segment hashes is caught: its
verifiers answer a mismatch, it disputes, the referees confirm, it is slashed and unpaid while its
co-workers are paid. Last, a worker SIGKILLed mid-task: the other two finish, commit, and once the
commit grace has passed are audited (replaying the departure) and paid, the absent worker's share
going back to the owner. Payouts are checked against the settlement rule re-derived from the slots;
balances move by exactly the payouts (fees aside); supply is conserved.
"""
import hashlib
import json
import time
import urllib.request
from types import SimpleNamespace

import pytest

from consensus.genesis import Params
from consensus.state.deadlines import commit_span_ms
from consensus.state.tasks import task_id_for, worker_weight
from consensus.tx import DEFAULT_FEE, build_tx
from devtools.devnet import FAST_TASK_PARAMS, ComputeDevnet
from ml.compute.task_spec import submit_payload
from ml.profiles import portable_cpu_profile, torch_release
from ml.train.spec import TrainSpec
from node.ledger import jsonrpc
from node.ledger.errors import RpcAnswerError

pytestmark = pytest.mark.timeout(240)

SPEC = TrainSpec(codec="int8", steps=20, segment_steps=5)
PRICE = 100_000
PARAMS = {"verifier_share_bps": 500, "relay_share_bps": 1_000, "slash_mismatch_bps": 1_000}
VERIFIER_POOL = PRICE * 500 // 10_000
WORKER_SHARE = (PRICE - VERIFIER_POOL - PRICE * 1_000 // 10_000) // 3


@pytest.fixture(scope="module")
def devnet(tmp_path_factory):
    net = ComputeDevnet.create(tmp_path_factory.mktemp("devnet"), validators=2, compute=4, params=PARAMS)
    try:
        net.up(timeout=120)
        yield net
    finally:
        net.down(timeout=5)


def rpc(net, method, *params):
    return jsonrpc.call(net.rpc_url, method, *params)


PROFILE = portable_cpu_profile(torch_release())   # what `dekube-node task submit` names for a cpu task


def submit(net, spec: TrainSpec = SPEC) -> str:
    faucet = net.testnet.faucet()
    nonce = rpc(net, "dkb_getTransactionCount", faucet.peer_id, "pending")
    tx = build_tx(faucet, net.testnet.chain_id, nonce, "submit_task", submit_payload(spec, 3, PRICE, PROFILE))
    rpc(net, "dkb_sendRawTransaction", tx.raw.hex())
    return task_id_for(faucet.peer_id, nonce).hex()


def wait_paid(net, task_id: str, timeout: float = 150) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = rpc(net, "dkb_getTask", task_id)
        if task is not None and task["status"] == "paid":
            return task
        time.sleep(0.3)
    raise AssertionError(f"task not paid in {timeout} s: {rpc(net, 'dkb_getTask', task_id)}")


def balances(net) -> dict[str, int]:
    """Each compute node's and the faucet's balance plus the fees it has paid so far (every executed
    transaction pays DEFAULT_FEE, ADR 0135), so differences are exactly what the task moved."""
    peers = [n.peer_id for n in net.compute] + [net.testnet.faucet().peer_id]
    return {peer: balance_plus_fees(net, peer) for peer in peers}


def balance_plus_fees(net, peer: str) -> int:
    """Balance + fees paid, from reads of one height: the nonce read before and after the balance
    must agree (a block committing one of the peer's txs between the two reads would count its fee
    twice)."""
    for _ in range(50):
        nonce = rpc(net, "dkb_getTransactionCount", peer)
        balance = rpc(net, "dkb_getBalance", peer)
        if rpc(net, "dkb_getTransactionCount", peer) == nonce:
            return balance + DEFAULT_FEE * nonce
    raise AssertionError(f"{peer}'s nonce kept changing")


def check_supply(net) -> None:
    supply = rpc(net, "dkb_getSupply")
    assert supply["total"] == supply["genesis"], supply


def answer_key(answer: dict | None):
    return None if answer is None else (answer["match"], answer["evidence"])


def check_slots(task: dict, workers: list[str], guilty: frozenset[str] = frozenset()) -> None:
    """Every committed worker has its audit slots, each resolved: ``guilty`` for the workers in
    ``guilty`` (a mismatch the referees confirmed), ``ok`` for the others; verifiers and referees are
    never the owner or the audited worker, and an honest party's answer equals the verdict."""
    slots = task["slots"]
    assert slots and sorted({s["worker"] for s in slots}) == sorted(workers), slots
    assert [s["slot"] for s in slots] == list(range(len(slots)))
    for slot in slots:
        worker = slot["worker"]
        parties = [v["verifier"] for v in slot["verifiers"]] + [r["referee"] for r in slot["referees"]]
        assert worker not in parties and task["owner"] not in parties, slot
        assert 0 <= slot["segment"] < task["segments"] and len(bytes.fromhex(slot["salt"])) == 32
        verdict = answer_key(slot["verdict"])
        if worker in guilty:
            assert slot["outcome"] == "guilty" and verdict[0] is False, slot
            assert slot["dispute"] is not None and slot["referees"], slot   # the cheater disputed; referees decided
        else:
            assert slot["outcome"] == "ok" and verdict[0] is True and not slot["referees"], slot
            answered = [v for v in slot["verifiers"] if v["answer"] is not None]
            assert answered and all(answer_key(v["answer"]) == verdict for v in answered), slot


def expected_payouts(task: dict, paid_workers: list[str]) -> dict[str, int]:
    """The settlement (docs/adr/0168) re-derived from the resolved slots: each worker not found guilty
    gets its full share; the verifier pool is split equally over the slots with at least one answer
    (or referee vote) equal to the verdict, a slot's part equally among those; the owner gets the rest."""
    out = {w: WORKER_SHARE for w in paid_workers}
    pool = VERIFIER_POOL + surcharge(task)   # a task cut into few segments pays its audits on top (ADR 0212)
    payees_by_slot = []
    for slot in task["slots"]:
        verdict = answer_key(slot["verdict"])
        payees = [v["verifier"] for v in slot["verifiers"] if answer_key(v["answer"]) == verdict]
        payees += [r["referee"] for r in slot["referees"] if answer_key(r["vote"]) == verdict]
        if verdict is not None and payees:
            payees_by_slot.append(payees)
    for payees in payees_by_slot:
        for peer in payees:
            out[peer] = out.get(peer, 0) + pool // len(payees_by_slot) // len(payees)
    out[task["owner"]] = PRICE + surcharge(task) - sum(out.values())
    return out


def surcharge(task: dict) -> int:
    """The audit surcharge the task escrowed on top of its price (docs/adr/0212; 0 when none)."""
    return int(task["spec"].get("audit_surcharge", 0))


def judges(task: dict) -> set[str]:
    """The verifiers and referees that answered one of the task's slots."""
    return ({v["verifier"] for s in task["slots"] for v in s["verifiers"] if v["answer"] is not None}
            | {r["referee"] for s in task["slots"] for r in s["referees"] if r["vote"] is not None})


def http_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def metrics_text(node) -> str:
    with urllib.request.urlopen(f"{node.rpc_url}/metrics", timeout=5) as response:
        return response.read().decode()


def test_task_is_trained_audited_by_replay_and_paid(devnet):
    before = balances(devnet)
    task_id = submit(devnet)
    task = wait_paid(devnet, task_id)
    owner, workers = task["owner"], task["workers"]
    assert len(workers) == 3 and len(task["commits"]) == 3
    assert task["profile"] == PROFILE and task["segments"] == SPEC.segment_count
    # data-parallel: every worker ends with the same weights, but each commits its own segment records
    # (its own gradients; the leaves name the worker, docs/adr/0167)
    assert len({commit[1] for commit in task["commits"].values()}) == 1
    assert len({commit[0] for commit in task["commits"].values()}) == 3
    assert len(task["slots"]) == 3 * 2   # audits_per_worker (default 2) slots per committed worker
    check_slots(task, workers)
    expected = expected_payouts(task, workers)
    assert task["payouts"] == expected
    assert sum(expected.values()) == PRICE + surcharge(task)
    assert sum(v for p, v in expected.items() if p != owner) > 3 * WORKER_SHARE
    after = balances(devnet)
    for peer in set(expected) - {owner}:
        assert after[peer] - before[peer] == expected[peer]
    assert after[owner] - before[owner] == expected[owner] - PRICE - surcharge(task)
    check_supply(devnet)
    # each committer reported the upload rates its all-reduce agreed for its co-workers, and the paid task
    # made them measurements on the co-workers' records (ADR 0219; two reporters: not yet verified)
    assert set(task["rate_reports"]) == set(workers)
    for reporter, rates in task["rate_reports"].items():
        assert set(rates) == set(workers) - {reporter} and all(mbps > 0 for mbps in rates.values()), rates
    for worker in workers:
        measured = rpc(devnet, "dkb_getNode", worker)["measured"]
        assert sorted(reporter for reporter, _, _ in measured) == sorted(set(workers) - {worker})

    worker_node = next(n for n in devnet.compute if n.peer_id == workers[0])
    job = http_json(f"{worker_node.rpc_url}/status")["compute"]["jobs"][task_id]
    assert job["state"] == "committed" and job["step"] == SPEC.steps and job["bytes_sent"] > 0
    assert job["metrics"]["accuracy"] > 50
    assert jsonrpc.call(worker_node.rpc_url, "dkb_taskProgress", task_id)["step"] == SPEC.steps
    assert 'dekube_compute_tasks_total{outcome="committed"} 1.0' in metrics_text(worker_node)
    # the worker measured its link (the all-reduce's upload rate, probes of its co-workers) and its
    # ledger record now carries that figure instead of the configured guess (ADR 0158)
    deadline = time.monotonic() + 60
    while (measured := http_json(f"{worker_node.rpc_url}/status")["bandwidth"]).get("upload_mbps") is None or \
            rpc(devnet, "dkb_getNode", workers[0])["hardware"]["bandwidth_mbps"] == 100:
        assert time.monotonic() < deadline, (measured, rpc(devnet, "dkb_getNode", workers[0]))
        time.sleep(0.5)
    # each node that answered an audit counted it (the task can be paid, by a worker, before a verifier
    # has seen its last answer's receipt)
    answers: dict[str, int] = {}
    for slot in task["slots"]:
        for v in slot["verifiers"]:
            if v["answer"] is not None:
                answers[v["verifier"]] = answers.get(v["verifier"], 0) + 1
    for peer, count in answers.items():
        node = next(n for n in devnet.compute if n.peer_id == peer)
        deadline = time.monotonic() + 15
        while f'dekube_compute_audits_total{{verdict="match"}} {count}.0' not in metrics_text(node):
            assert time.monotonic() < deadline, metrics_text(node)
            time.sleep(0.2)


@pytest.mark.slow
def test_diloco_task_per_worker_segments_are_audited_and_paid(devnet):
    task = wait_paid(devnet, submit(devnet, TrainSpec(mode="diloco", codec="int8", steps=30, inner_steps=10)))
    assert len({commit[0] for commit in task["commits"].values()}) == 3   # pseudo-gradients differ per worker
    check_slots(task, task["workers"])
    assert task["payouts"] == expected_payouts(task, task["workers"])
    check_supply(devnet)


def placement_weight(net, peer: str) -> int:
    """The ledger's worker_weight of `peer` (stake, reputation, measured bandwidth class) from RPC reads."""
    node, stake = rpc(net, "dkb_getNode", peer), rpc(net, "dkb_getStake", peer)
    state = SimpleNamespace(nodes={peer: SimpleNamespace(hardware=node["hardware"], reputation=node["reputation"],
                                                         measured=node["measured"])},
                            stakes={peer: SimpleNamespace(bonded=stake["bonded"])})
    return worker_weight(state, peer)


def test_worker_committing_wrong_hashes_is_caught_slashed_and_unpaid(devnet):
    # The node the ledger ranks first for the next task (weight: stake, reputation from the paid tasks,
    # measured bandwidth, which a restart keeps; ties broken by sha256(task id, peer id), the task id
    # known from the faucet's next nonce) is among its workers: make it the cheater.
    faucet = devnet.testnet.faucet()
    upcoming = task_id_for(faucet.peer_id, rpc(devnet, "dkb_getTransactionCount", faucet.peer_id, "pending"))
    cheater = min(devnet.compute, key=lambda n: (-placement_weight(devnet, n.peer_id),
                                                 hashlib.sha256(upcoming + n.peer_id.encode()).digest()))
    devnet.testnet.stop_node(cheater, timeout=5)
    devnet.start_compute(cheater, {"DEKUBE_COMPUTE_FAULT_INJECT": "wrong_segments"})
    time.sleep(1.0)
    devnet.wait_registered([cheater], 60)
    stake_before = rpc(devnet, "dkb_getStake", cheater.peer_id)["bonded"]
    before = balances(devnet)

    task = wait_paid(devnet, submit(devnet))
    assert cheater.peer_id in task["workers"] and cheater.peer_id in task["commits"]
    check_slots(task, task["workers"], guilty=frozenset({cheater.peer_id}))
    honest = [w for w in task["workers"] if w != cheater.peer_id]
    expected = expected_payouts(task, honest)   # the cheater may still earn a verifier's share
    assert task["payouts"] == expected
    assert all(task["payouts"][w] >= WORKER_SHARE for w in honest)
    # no worker pay: only what the draws made it earn as a verifier (with the audit surcharge in the pool, that
    # can exceed a worker's share, so compare with the verifier-only split, not the share)
    assert task["payouts"].get(cheater.peer_id, 0) == expected_payouts(task, []).get(cheater.peer_id, 0)
    after = balances(devnet)
    for peer in set(expected) - {task["owner"]}:
        assert after[peer] - before[peer] == expected[peer]
    assert after[cheater.peer_id] - before[cheater.peer_id] == expected.get(cheater.peer_id, 0)
    assert rpc(devnet, "dkb_getStake", cheater.peer_id)["bonded"] == stake_before - stake_before * 1_000 // 10_000
    assert all(rpc(devnet, "dkb_getStake", peer)["bonded"] > 0 for peer in judges(task))
    assert rpc(devnet, "dkb_getNode", cheater.peer_id)["reputation"] < 0 + 1   # +1 then -10
    check_supply(devnet)
    # back to honest for what follows; the restarted node bonds its configured stake again (a balance
    # move the next test must not see)
    devnet.testnet.stop_node(cheater, timeout=5)
    devnet.start_compute(cheater)
    devnet.wait_registered([cheater], 60)
    deadline = time.monotonic() + 30
    while rpc(devnet, "dkb_getStake", cheater.peer_id)["bonded"] != stake_before:
        assert time.monotonic() < deadline, rpc(devnet, "dkb_getStake", cheater.peer_id)
        time.sleep(0.3)


def test_task_cli_lists_shows_and_reports_payouts(devnet, capsys):
    from cli.main import main as cli_main

    assert cli_main(["task", "list", "--rpc", devnet.rpc_url, "--status", "paid", "--json"]) == 0
    tasks = json.loads(capsys.readouterr().out)
    assert tasks and all(t["status"] == "paid" for t in tasks)
    task_id = tasks[-1]["task_id"]
    task = rpc(devnet, "dkb_getTask", task_id)
    assert cli_main(["task", "show", task_id, "--rpc", devnet.rpc_url]) == 0
    out = capsys.readouterr().out
    assert "status:     paid" in out and f"audit slots ({len(task['slots'])}, profile {PROFILE}):" in out
    for slot in task["slots"]:   # each slot: its outcome, segment, worker, and each verifier's answer
        head = f"  slot {slot['slot']}  {slot['outcome']:9}  segment {slot['segment']} of {slot['worker'][:16]}.."
        assert head in out
        for v in slot["verifiers"]:
            assert f"verifier {v['verifier'][:16]}..  " in out
    assert cli_main(["task", "wait", task_id, "--rpc", devnet.rpc_url]) == 0
    out = capsys.readouterr().out
    assert "audit slots" in out and "verifier" in out
    assert sum(f"  {w}  worker " in out for w in task["workers"]) == 3
    assert cli_main(["task", "show", "00" * 32, "--rpc", devnet.rpc_url]) == 1


def wait_for_step(node, task_id: str, step: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if jsonrpc.call(node.rpc_url, "dkb_taskProgress", task_id)["step"] >= step:
                return
        except RpcAnswerError:   # not assigned to it yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"{node.name} did not reach step {step} of {task_id} in {timeout} s")


def test_worker_killed_mid_task_the_others_are_audited_and_paid(devnet):
    # Last in this module: it leaves a compute node dead.
    spec = TrainSpec(codec="int8", steps=100, segment_steps=10)
    before = balances(devnet)
    task_id = submit(devnet, spec)
    deadline = time.monotonic() + 60
    while not (rpc(devnet, "dkb_getTask", task_id) or {}).get("workers"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    workers = rpc(devnet, "dkb_getTask", task_id)["workers"]
    victim = next(n for n in devnet.compute if n.peer_id == workers[-1])
    wait_for_step(victim, task_id, 10)
    devnet.testnet.kill_node(victim)

    task = wait_paid(devnet, task_id, timeout=200)
    survivors = [w for w in workers if w != victim.peer_id]
    assert sorted(task["commits"]) == survivors
    quorum_height = max(commit[3] for commit in task["commits"].values())
    quorum_time = rpc(devnet, "dkb_getBlockByNumber", quorum_height)["time_ms"]   # deadlines: block times
    assigned_time = rpc(devnet, "dkb_getBlockByNumber", task["assigned_height"])["time_ms"]
    span = commit_span_ms(Params(**{**FAST_TASK_PARAMS, **PARAMS}), 0)
    assert task["commit_deadline"] == quorum_time + span // 4 < assigned_time + span  # the grace
    check_slots(task, survivors)
    assert victim.peer_id not in judges(task)   # drawn or not, a dead node answers nothing
    for slot in task["slots"]:   # a slot that drew it got a redrawn verifier at its deadline, which answered
        if any(v["verifier"] == victim.peer_id for v in slot["verifiers"]):
            redrawn = [v for v in slot["verifiers"] if v["redraw"]]
            assert redrawn and all(v["answer"] is not None for v in redrawn), slot
    expected = expected_payouts(task, survivors)   # the absent worker's share comes back to the owner
    assert task["payouts"] == expected and expected[task["owner"]] >= WORKER_SHARE
    after = balances(devnet)
    assert after[victim.peer_id] == before[victim.peer_id]
    for peer in set(expected) - {task["owner"]}:
        assert after[peer] - before[peer] == expected[peer]
    assert rpc(devnet, "dkb_getNode", victim.peer_id)["active_tasks"] == 0
    survivor_node = next(n for n in devnet.compute if n.peer_id == survivors[0])
    job = http_json(f"{survivor_node.rpc_url}/status")["compute"]["jobs"][task_id]
    assert job["state"] == "committed" and job["step"] == spec.steps
    assert list(job["departures"]) == [victim.peer_id] and job["departures"][victim.peer_id] >= 10
    check_supply(devnet)

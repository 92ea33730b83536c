"""The commit quorum: a task whose worker never commits moves to the audit window with the committers
once a majority committed and the grace has passed; the absent worker is not paid (its share goes
back to the owner), supply is conserved, and replicas (and a reloaded state) agree on every step."""
import pytest
from test_ledger_kit import CHAIN, HONEST_EVIDENCE, answer_all_slots, crew_chain, ident, run_scheduled_draws

from consensus.block import build_block
from consensus.state.deadlines import commit_grace_ms
from consensus.state.ledger import Ledger
from consensus.state.records import Task, TaskStatus
from consensus.state.store import LedgerState
from consensus.state.tasks import commit_quorum, task_id_for
from consensus.txcodes import TxCode

OWNER, W1, W2, W3, VERIFIER, OUTSIDER = (ident(i) for i in range(1, 7))
PRICE = 9_000
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
SPEC = {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 100}, "workers": 3,
        "sync_mode": "allreduce", "codec": "int8", "profile": PROFILE, "segments": 4}
TIMEOUT, GRACE = 12, 3   # seconds = blocks of the test chain (1 s each): task_min_s, and a quarter of it
HARDWARE = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100, "profiles": [PROFILE]}


@pytest.fixture
def chain():
    return crew_chain((W1, W2, W3), VERIFIER, HARDWARE)


def submit(chain) -> bytes:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**SPEC, "price": PRICE})
    return task_id_for(OWNER.peer_id, nonce)


def commit(chain, who, task_id):
    return chain.run(who, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                            "result_hash": b"\x22" * 32, "segments": 4})


def audit(chain, task_id, slot=0, match=True):
    return chain.run(VERIFIER, "audit_result", {"task_id": task_id, "slot": slot, "match": match,
                                                "evidence": HONEST_EVIDENCE, "step": 0, "blinding": b"\x00" * 32})


def test_quorum_is_a_strict_majority_and_grace_follows_the_timeout(chain):
    assert [commit_quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert commit_grace_ms(chain.params, Task(OWNER.peer_id, 1, dict(SPEC), PRICE, 1)) == GRACE * 1000


def test_absent_worker_does_not_hold_the_task_open_and_is_not_paid(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    assert task.workers == sorted(w.peer_id for w in (W1, W2, W3))
    assert task.commit_deadline == 1000 * (task.assigned_height + TIMEOUT)   # block times in ms
    assert commit(chain, W1, task_id).code == TxCode.OK
    assert task.commit_deadline == 1000 * (task.assigned_height + TIMEOUT)   # below quorum
    assert commit(chain, W2, task_id).code == TxCode.OK
    quorum_height = chain.ledger.height
    assert task.commit_deadline == 1000 * (quorum_height + GRACE)
    assert audit(chain, task_id).code == TxCode.BAD_STATE   # no audits while commits may come
    chain.empty_blocks(task.commit_deadline // 1000 - chain.ledger.height - 1)
    assert task.status == TaskStatus.RUNNING       # the last worker may still commit in the next block
    result = chain.block()                          # the deadline block: the phase closes at its end
    assert task.status == TaskStatus.COMMITTED and task.audit_seed == b""   # drawn from a later beacon (ADR 0202)
    assert task.window_end == 1000 * (chain.ledger.height + chain.params.audit_window_s)
    assert {"type": "audit_window_opened", "task_id": task_id, "absent": [W3.peer_id]} in result.events
    assert commit(chain, W3, task_id).code == TxCode.BAD_STATE
    assert [slot["worker"] for slot in task.slots] == sorted([W1.peer_id, W2.peer_id])   # committers only
    assert audit(chain, task_id, slot=2).code == TxCode.BAD_PAYLOAD   # no third slot
    assert task.status == TaskStatus.COMMITTED
    run_scheduled_draws(chain, task_id)
    assert len(task.audit_seed) == 32 and all(slot["verifiers"] for slot in task.slots)
    answer_all_slots(chain, task_id)
    assert task.status == TaskStatus.VERIFIED       # every committer matched; the absent one is no blocker

    before = {who.peer_id: chain.ledger.balance(who.peer_id) for who in (OWNER, W1, W2, W3, VERIFIER)}
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    verifier_pool, relay_budget = PRICE * 500 // 10_000, PRICE * 1_000 // 10_000
    share = (PRICE - verifier_pool - relay_budget) // 3
    verifiers = [slot["verifiers"][0]["verifier"] for slot in task.slots]
    expected = {W1.peer_id: share, W2.peer_id: share}
    for verifier in verifiers:
        expected[verifier] = expected.get(verifier, 0) + verifier_pool // 2
    expected[OWNER.peer_id] = PRICE - sum(expected.values())
    assert task.payouts == expected
    for who in (OWNER, W1, W2, W3, VERIFIER):
        assert chain.ledger.balance(who.peer_id) - before[who.peer_id] == task.payouts.get(who.peer_id, 0)
    assert chain.ledger.node_info(W3.peer_id)["reputation"] == -5
    assert chain.ledger.node_info(W1.peer_id)["reputation"] == 1
    assert all(chain.ledger.node_info(w.peer_id)["active_tasks"] == 0 for w in (W1, W2, W3))


def test_a_straggler_within_the_grace_joins_the_audit(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    commit(chain, W1, task_id)
    commit(chain, W3, task_id)
    chain.empty_blocks(GRACE - 1)
    assert commit(chain, W2, task_id).code == TxCode.OK   # the deadline block itself still accepts it
    assert task.status == TaskStatus.COMMITTED and sorted(task.commits) == task.workers


def test_below_quorum_the_task_waits_for_its_full_timeout(chain):
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    commit(chain, W2, task_id)
    chain.empty_blocks(GRACE + 2)
    assert task.status == TaskStatus.RUNNING
    assert chain.run(OUTSIDER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE
    assert commit(chain, W1, task_id).code == TxCode.OK    # late, but before the timeout: quorum now
    assert task.commit_deadline == 1000 * (chain.ledger.height + GRACE)


def test_a_restarted_replica_closes_the_phase_at_the_same_block_with_the_same_app_hash(chain):
    task_id = submit(chain)
    commit(chain, W1, task_id)
    commit(chain, W2, task_id)
    replica = Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items()))   # restart from storage
    assert replica.state.tasks[task_id] == chain.ledger.state.tasks[task_id]
    closed_at = []
    for _ in range(GRACE + 1):
        led = chain.ledger
        block = build_block(CHAIN, led.height + 1, 1000 * (led.height + 1), led.last_block_hash, led.app_hash,
                            chain.proposer_identity, led.beacon, [], ())
        results = [led.apply_block(block), replica.apply_block(block)]
        assert results[0].app_hash == results[1].app_hash and results[0].events == results[1].events
        if any(event["type"] == "audit_window_opened" for event in results[0].events):
            closed_at.append(block.header.height)
    assert closed_at == [chain.ledger.state.tasks[task_id].commit_deadline // 1000]
    assert replica.state.tasks[task_id] == chain.ledger.state.tasks[task_id]
    assert replica.state.tasks[task_id].status == TaskStatus.COMMITTED
    assert replica.full_state_hash() == chain.ledger.full_state_hash()


def test_commit_deadline_is_part_of_the_encoded_task():
    task = Task(OWNER.peer_id, 1, dict(SPEC), PRICE, 5)
    task.commit_deadline = 17
    decoded = Task.decode(task.encode())
    assert decoded.commit_deadline == 17 and decoded == task
    task.commit_deadline = 18
    assert Task.decode(task.encode()) != decoded

"""Task deadlines in block time, derived from the declared work (ADR 0187), on the pure ledger handlers
with the block times under the test's control: a job longer than 200 blocks on a chain 10x faster
than an idle local one is still paid; a task nobody committed to ends ``expired`` with its reason (the
owner refunded, never ``paid``); one whose every committer was found guilty ends ``failed``."""
import pytest
from test_ledger_kit import Chain, answer_all_slots, ident, run_scheduled_draws

from consensus.genesis import Genesis, GenesisError, Params, hashed_params
from consensus.ledger_events import task_events
from consensus.state import deadlines
from consensus.state.records import Task, TaskStatus
from consensus.state.tasks import task_id_for
from consensus.txcodes import TxCode

OWNER, W1, W2, W3, V1, V2, OUTSIDER = (ident(i) for i in range(1, 8))
PRICE = 100_000
SPEC = {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 200}, "workers": 3,
        "sync_mode": "allreduce", "codec": "int8", "segments": 4, "profile": "cpu-x86-64-avx2/torch-2.13.0"}
HARDWARE = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100,
            "profiles": [SPEC["profile"]]}
FAST_BLOCK_MS = 33      # ~30 blocks/s: ten times an idle local chain's ~3 blocks/s (issue 23)
JOB_S = 78              # the user's 200-step job on a busy machine


def market(params: Params, block_ms: int = FAST_BLOCK_MS) -> Chain:
    chain = Chain(params=params, block_ms=block_ms)
    for who, roles, bond in ((W1, ["compute"], 3000), (W2, ["compute"], 2000), (W3, ["compute"], 1000),
                             (V1, ["verifier"], 500), (V2, ["verifier"], 500)):
        chain.ok(who, "register_node", {"roles": roles, "listen_addrs": [], "relay_addrs": [], "hardware": HARDWARE})
        chain.ok(who, "bond", {"amount": bond})
    return chain


def submit(chain: Chain, **extra) -> bytes:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**SPEC, "price": PRICE, **extra})
    return task_id_for(OWNER.peer_id, nonce)


def commit_txs(chain: Chain, task_id: bytes, workers) -> list:
    return [chain.tx(w, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                          "result_hash": b"\x22" * 32, "segments": 4}) for w in workers]


def run_for(chain: Chain, seconds: float) -> int:
    """Empty blocks for (at most) ``seconds`` of block time; returns how many."""
    blocks = int(seconds * 1000) // chain.block_ms
    chain.empty_blocks(blocks)
    return blocks


def chain_params(**overrides) -> Params:
    """The genesis defaults (deadlines included), with two verifiers' worth of audits."""
    # stake_cover_bps 0: these workers bond far less than 10x their pay (ADR 0188; not what these tests are about)
    return Params(**{"min_fee": 0, "audits_per_worker": 1, "audit_double_bps": 0, "stake_cover_bps": 0,
                     "max_audit_share_bps": 10_000, **overrides})


@pytest.mark.parametrize("declared", [{"expected_s": JOB_S}, {}], ids=["expected_s", "legacy-submit"])
def test_a_job_longer_than_200_blocks_on_a_fast_chain_is_paid(declared):
    chain = market(chain_params())
    task_id = submit(chain, **declared)
    task = chain.ledger.state.tasks[task_id]
    assert task.status == TaskStatus.ASSIGNED
    blocks = run_for(chain, JOB_S)                          # the workers train for 78 s of block time
    assert blocks > 2000 > chain.params.task_timeout        # far beyond the old 200-block deadline
    result = chain.block(commit_txs(chain, task_id, (W1, W2, W3)))
    assert [r.code for r in result.receipts] == [TxCode.OK] * 3
    assert task.status == TaskStatus.COMMITTED
    run_for(chain, 20)                                      # verifiers replay for 20 s (> 50 blocks here)
    assert all(v["redraw"] is False for slot in task.slots for v in slot["verifiers"])   # nobody cut off
    answer_all_slots(chain, task_id)
    assert task.status == TaskStatus.VERIFIED
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID
    assert all(task.payouts.get(w.peer_id, 0) > 0 for w in (W1, W2, W3))


def test_the_commit_deadline_follows_the_declared_work_and_the_genesis_bounds():
    params = Params(min_fee=0, stake_cover_bps=0)
    chain = market(params, block_ms=1000)
    short = submit(chain, expected_s=10)
    assigned_at = chain.ledger.state.last_block_time_ms      # assigned at the end of the submit's block
    assert chain.ledger.state.tasks[short].commit_deadline == assigned_at + params.task_min_s * 1000   # the floor
    assert deadlines.commit_span_ms(params, 10) == params.task_min_s * 1000
    assert deadlines.commit_span_ms(params, 36_000) == (36_000 * 4 + params.task_slack_s) * 1000   # a 10-hour job
    too_long = params.task_max_s                   # x4 + slack is beyond task_max_s: refused before escrow
    before = chain.ledger.balance(OWNER.peer_id)
    receipt = chain.run(OWNER, "submit_task", {**SPEC, "price": PRICE, "expected_s": too_long})
    assert receipt.code == TxCode.BAD_PAYLOAD and "task_max_s" in receipt.log
    assert chain.ledger.balance(OWNER.peer_id) == before


def test_a_task_nobody_commits_to_expires_refunded_with_a_reason_never_paid():
    chain = market(chain_params(task_min_s=30, task_slack_s=0))
    before = chain.ledger.balance(OWNER.peer_id)
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    deadline = task.commit_deadline
    run_for(chain, 29)
    assert task.status == TaskStatus.ASSIGNED
    events = []
    while task.status == TaskStatus.ASSIGNED:
        events += task_events(chain.block())
    assert chain.ledger.state.last_block_time_ms >= deadline > chain.ledger.state.last_block_time_ms - FAST_BLOCK_MS
    assert task.status == TaskStatus.EXPIRED != TaskStatus.PAID
    assert "no worker committed a result by the commit deadline" in task.reason
    assert task.payouts == {OWNER.peer_id: PRICE} and task.escrow == 0
    assert chain.ledger.balance(OWNER.peer_id) == before
    [ended] = [e for e in events if e["task_id"] == task_id.hex()]
    assert ended["event"] == "expired" and ended["reason"] == task.reason
    doc = chain.ledger.task_info(task_id)
    assert doc["status"] == "expired" and doc["reason"] == task.reason
    assert doc["block_time_ms"] == chain.ledger.state.last_block_time_ms
    for w in (W1, W2, W3):                                   # freed, and marked as no-shows
        info = chain.ledger.node_info(w.peer_id)
        assert info["active_tasks"] == 0 and info["reputation"] == -5
    assert chain.run(OUTSIDER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE
    assert chain.run(W1, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                           "result_hash": b"\x22" * 32, "segments": 4}).code == TxCode.BAD_STATE


def test_a_task_whose_every_committer_is_guilty_fails_with_a_reason():
    chain = market(chain_params(dispute_s=5, audit_window_s=5), block_ms=1000)
    task_id = submit(chain)
    task = chain.ledger.state.tasks[task_id]
    chain.block(commit_txs(chain, task_id, (W1, W2, W3)))
    assert task.status == TaskStatus.COMMITTED
    run_scheduled_draws(chain, task_id)                      # slots drawn beacon_delay blocks later (ADR 0202)
    answer_all_slots(chain, task_id, match=False, evidence=b"\x0b" * 32)
    run_for(chain, 7)                                        # nobody disputes: every slot guilty
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.FAILED and "found wrong by its audits" in task.reason
    assert all(slot["outcome"] == "guilty" for slot in task.slots)
    verifier_pool = PRICE * chain.params.verifier_share_bps // 10_000    # workers verify each other: only that
    assert sum(task.payouts.get(w.peer_id, 0) for w in (W1, W2, W3)) <= verifier_pool
    assert chain.ledger.task_info(task_id)["status"] == "failed"


def test_a_deadline_passes_by_block_time_whatever_the_block_rate():
    for block_ms in (2000, 50):
        chain = market(chain_params(task_min_s=60, task_slack_s=0), block_ms)
        task_id = submit(chain)
        task = chain.ledger.state.tasks[task_id]
        run_for(chain, 59)
        assert task.status == TaskStatus.ASSIGNED
        run_for(chain, 2)
        assert task.status == TaskStatus.EXPIRED


def test_time_params_keep_old_genesis_hashes_and_are_validated():
    genesis = Genesis("c", 0, {}, (), Params())
    obj = genesis.to_obj()
    names = ("deadline_factor_pct", "task_slack_s", "task_min_s", "task_max_s", "audit_answer_s", "dispute_s",
             "audit_window_s", "task_assign_s")
    for name in names:
        assert name not in hashed_params(Params())
        del obj["params"][name]                              # a genesis file written before them
    assert Genesis.from_obj(obj).hash == genesis.hash and Genesis.from_obj(obj).params == Params()
    assert Genesis("c", 0, {}, (), Params(task_min_s=60)).hash != genesis.hash
    for bad in ({"deadline_factor_pct": 99}, {"task_min_s": 0}, {"task_min_s": 10, "task_max_s": 9},
                {"task_max_s": 400 * 86_400}, {"dispute_s": 0}, {"audit_answer_s": 0}, {"task_assign_s": 0}):
        with pytest.raises(GenesisError):
            Params(**bad).validate()


def test_replay_deadlines_scale_with_one_segment_of_the_declared_work():
    params = Params()
    task = Task(OWNER.peer_id, 1, {**SPEC, "expected_s": 4_000}, PRICE, 1)
    task.segments = 4
    assert deadlines.replay_ms(task) == 1_000_000
    assert deadlines.work_span_ms(params, deadlines.replay_ms(task), params.audit_answer_s) \
        == 4_000_000 + params.audit_answer_s * 1000

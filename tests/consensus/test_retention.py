"""Bounded ledger state (docs/adr/0215): an ended task leaves the state ``ended_task_retention_s`` of block time
after its end (its id stays as a tombstone for as long again), never while an audit, dispute or the rejection
bars still read it; old double-sign evidence leaves once no block could accept it again; at most
PRUNE_PER_BLOCK entries a block; every replica (one loaded from storage too) drops the same keys."""
import asyncio

import pytest
from test_audit_slots import (
    ANSWER_BLOCKS,
    FAKE,
    OWNER,
    W1,
    W2,
    answer_rest_honestly,
    committed_task,
    make_chain,
    slashed,
    slots_of,
    vote,
)
from test_ledger_evidence import REPORTER, double_vote
from test_ledger_kit import Chain, answer_slot, ident, run_scheduled_draws, run_until

import cli.task
import consensus.state.retention as retention
from cli.main import main
from consensus.genesis import Genesis, GenesisError, Params, hashed_params
from consensus.state.ledger import Ledger
from consensus.state.records import TaskStatus
from consensus.state.rejections import recent_bars
from consensus.state.snapshot import check_chunk, make_manifest, split_chunks
from consensus.state.store import LedgerState
from consensus.state.tasks import task_id_for
from consensus.txcodes import TxCode
from consensus.validator.rpc_methods import LedgerMethods
from node.rpc.errors import RESOURCE_NOT_FOUND, RpcError

RETENTION_S = 20
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
SPEC = {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 100}, "workers": 2,
        "sync_mode": "diloco", "codec": "int8", "profile": PROFILE, "segments": 8, "price": 10_000}
HARDWARE = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100, "profiles": [PROFILE]}
C1, C2 = ident(11), ident(12)


def params(**overrides):
    base = dict(task_min_s=12, task_slack_s=0, audit_window_s=2, min_fee=0, audits_per_worker=0,
                max_audit_share_bps=10_000, ended_task_retention_s=RETENTION_S)
    return Params(**{**base, **overrides})


def market(**overrides) -> Chain:
    chain = Chain(params=params(**overrides), balances={ident(i).peer_id: 1_000_000 for i in range(1, 16)})
    for worker in (C1, C2):
        chain.ok(worker, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                           "hardware": HARDWARE})
        chain.ok(worker, "bond", {"amount": 2000})
    return chain


def submit(chain, spec=SPEC) -> bytes:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", spec)
    return task_id_for(OWNER.peer_id, nonce)


def paid_task(chain) -> bytes:
    task_id = submit(chain)
    for worker in (C1, C2):
        chain.ok(worker, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                           "result_hash": b"\x22" * 32, "segments": 8})
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert chain.ledger.state.tasks[task_id].status == TaskStatus.PAID
    return task_id


def keys_of(task_id: bytes, items) -> list[bytes]:
    return [key for key, _ in items if key.endswith(task_id)]


def snapshot_items(state) -> list[tuple[bytes, bytes]]:
    chunks = split_chunks(state.items())
    manifest = make_manifest(state.height, bytes(32), chunks)
    return [pair for i, chunk in enumerate(chunks) for pair in check_chunk(manifest, i, chunk)]


def test_the_retention_param_defaults_to_a_week_keeps_old_genesis_hashes_and_is_validated():
    assert Params().ended_task_retention_s == 7 * 86_400
    assert "ended_task_retention_s" not in hashed_params(Params())
    assert hashed_params(Params(ended_task_retention_s=60))["ended_task_retention_s"] == 60
    Params(ended_task_retention_s=0).validate()   # 0: keep ended tasks forever
    with pytest.raises(GenesisError, match="ended_task_retention_s"):
        Params(ended_task_retention_s=10**12).validate()
    with pytest.raises(GenesisError):
        Genesis.from_obj({"chain_id": "x", "genesis_time_ms": 0, "params": {"ended_task_retention_s": -1}}).validate()


def test_a_paid_task_is_pruned_only_after_the_retention_in_block_time_then_its_id_is_forgotten():
    chain = market()
    task_id = paid_task(chain)
    ended_ms = chain.ledger.state.last_block_time_ms
    state = chain.ledger.state
    assert keys_of(task_id, state.items()) and keys_of(task_id, snapshot_items(state))
    run_until(chain, lambda: state.last_block_time_ms >= ended_ms + RETENTION_S * 1000 - 1000)
    assert task_id in state.tasks                          # one block short of the retention: kept
    result = chain.block()
    assert state.last_block_time_ms == ended_ms + RETENTION_S * 1000
    assert task_id not in state.tasks
    assert {"type": "task_pruned", "task_id": task_id, "ended_ms": ended_ms} in result.events
    assert (b"task/" + task_id, None) in result.changes    # the change set (app hash, storage) deletes it
    assert state.pruned_tasks == {task_id: ended_ms}
    # only the tombstone is left, and its entry in the queue
    assert [key.split(b"/")[0] for key in keys_of(task_id, state.items())] == [b"pruned", b"retire"]
    assert chain.ledger.task_info(task_id) is None and chain.ledger.list_tasks() == []
    assert b"task/" + task_id not in dict(snapshot_items(state))
    loaded = LedgerState.load(snapshot_items(state))       # what a node joining by state sync gets
    assert task_id not in loaded.tasks and loaded.pruned_tasks == {task_id: ended_ms}
    receipt = chain.run(OWNER, "finalize", {"task_id": task_id})
    assert receipt.code == TxCode.NOT_FOUND and "pruned" in receipt.log
    run_until(chain, lambda: state.last_block_time_ms >= ended_ms + 2 * RETENTION_S * 1000)
    assert state.pruned_tasks == {} and state.retire == {}
    assert keys_of(task_id, state.items()) == []
    assert chain.run(OWNER, "finalize", {"task_id": task_id}).log == f"unknown task {task_id.hex()}"


def test_retention_zero_keeps_ended_tasks_forever():
    chain = market(ended_task_retention_s=0)
    task_id = paid_task(chain)
    chain.empty_blocks(3 * RETENTION_S)
    assert task_id in chain.ledger.state.tasks and chain.ledger.state.retire == {}


# ---- what an audit or a dispute needs stays -------------------------------------------------------------

def test_a_disputed_task_is_kept_past_the_retention_and_its_dispute_settles_then_it_is_pruned():
    chain = make_chain(ended_task_retention_s=5)
    task_id, task, _ = committed_task(chain)
    slot = slots_of(task, W1)[0]
    accuser = slot["verifiers"][0]["verifier"]
    assert answer_slot(chain, task_id, slot["slot"], accuser, match=False, evidence=FAKE, step=2).code == TxCode.OK
    chain.ok(W1, "dispute", {"task_id": task_id, "slot": slot["slot"]})
    run_scheduled_draws(chain, task_id)
    referees = [r["referee"] for r in slot["referees"]]
    assert len(referees) == 3
    chain.empty_blocks(ANSWER_BLOCKS // 2)                 # the panel deliberates well past the retention
    state = chain.ledger.state
    assert state.tasks[task_id] is task and task.status == TaskStatus.DISPUTED and state.retire == {}
    for referee in referees:
        assert vote(chain, task_id, slot["slot"], referee).code == TxCode.OK
    assert slot["outcome"] == "ok"                         # the referees found the slot's record
    answer_rest_honestly(chain, task_id, task)
    bonded = chain.ledger.stake_info(accuser)["bonded"]
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert task.status == TaskStatus.PAID and slashed(chain, accuser) == bonded * 1000 // 10_000
    assert slashed(chain, W1) == 0 and slashed(chain, W2) == 0
    ended_ms = state.last_block_time_ms
    run_until(chain, lambda: task_id not in state.tasks)
    assert state.last_block_time_ms == ended_ms + 5000 and state.pruned_tasks == {task_id: ended_ms}


def test_a_task_whose_audit_slots_are_open_is_never_queued_however_long_it_waits():
    chain = make_chain(ended_task_retention_s=1, audit_answer_s=10_000)
    task_id, task, _ = committed_task(chain)
    chain.empty_blocks(60)
    assert task.status in TaskStatus.AUDITABLE and chain.ledger.state.tasks[task_id] is task
    assert chain.ledger.state.retire == {}
    answer_rest_honestly(chain, task_id, task)
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    run_until(chain, lambda: task_id in chain.ledger.state.pruned_tasks, limit=5)


def test_a_rejected_task_the_bars_still_read_is_kept_until_its_cooldown_passed(monkeypatch):
    cooldown = 40
    monkeypatch.setattr("consensus.state.rejections.REJECT_COOLDOWN_BLOCKS", cooldown)
    monkeypatch.setattr("consensus.state.retention.REJECT_COOLDOWN_BLOCKS", cooldown)
    chain = market(ended_task_retention_s=5)
    task_id = submit(chain, {**SPEC, "workers": 1})
    task = chain.ledger.state.tasks[task_id]
    [worker] = task.workers
    chain.ok(C1 if worker == C1.peer_id else C2, "reject_task", {"task_id": task_id, "reason": "no"})
    assert task.status == TaskStatus.REJECTED
    chain.empty_blocks(3 * 5)                              # three retentions: the bars still need it
    state = chain.ledger.state
    assert state.tasks[task_id] is task
    assert worker in recent_bars(state, state.height + 1).by_owner[OWNER.peer_id]
    run_until(chain, lambda: task_id not in state.tasks, limit=cooldown + 10)
    assert state.height > task.assigned_height + cooldown


# ---- the per-block bound, and every replica drops the same keys ------------------------------------

def mirror(chain):
    """A replica restarted from the chain's storage now, applying every later block beside it (its app hash
    and change set checked equal each time); returns it and the list the chain's block results go in."""
    replica = Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items()))
    apply = chain.ledger.apply_block
    results = []

    def both(block, *args, **kwargs):
        result = apply(block, *args, **kwargs)
        mirrored = replica.apply_block(block)
        assert mirrored.app_hash == result.app_hash and mirrored.changes == result.changes
        results.append(result)
        return result

    chain.ledger.apply_block = both
    return replica, results


def test_many_tasks_ending_together_are_pruned_over_several_blocks_identically_on_a_reloaded_replica():
    chain = Chain(params=params(task_assign_s=3))          # no compute node: every task expires unassigned
    count = 2 * retention.PRUNE_PER_BLOCK + 10
    first = chain.ledger.nonce(OWNER.peer_id)
    receipts = chain.block([chain.tx(OWNER, "submit_task", {**SPEC, "price": 1000}) for _ in range(count)]).receipts
    assert all(r.code == TxCode.OK for r in receipts)
    state = chain.ledger.state
    ids = {task_id_for(OWNER.peer_id, first + i) for i in range(count)}
    run_until(chain, lambda: all(state.tasks[t].status == TaskStatus.EXPIRED for t in ids))
    assert len(state.retire) == count
    chain.empty_blocks(2)
    replica, results = mirror(chain)
    run_until(chain, lambda: not ids & set(state.tasks))
    pruned_per_block = [sum(1 for e in result.events if e["type"] == "task_pruned") for result in results]
    assert [n for n in pruned_per_block if n] == [retention.PRUNE_PER_BLOCK, retention.PRUNE_PER_BLOCK, 10]
    assert set(state.pruned_tasks) == ids == set(replica.state.pruned_tasks)
    assert replica.state.items() == state.items()


# ---- evidence --------------------------------------------------------------------------------------------

def test_evidence_is_dropped_once_too_old_to_be_accepted_again_and_older_evidence_is_refused():
    max_age = 5
    chain = Chain(params=Params(evidence_max_age=max_age, min_fee=0))
    chain.empty_blocks(3)
    replica, _ = mirror(chain)                             # restarted just before the evidence's block
    assert chain.run(REPORTER, "evidence", {"evidence": double_vote(height=2)}).code == TxCode.OK
    state = chain.ledger.state
    [(key, applied)] = state.evidence.items()
    run_until(chain, lambda: state.height == applied + max_age - 1)
    assert key in state.evidence
    result = chain.block()
    assert key not in state.evidence and (b"evid/" + key, None) in result.changes
    # the same offence cannot slash again: its evidence is now too old to be accepted
    receipt = chain.run(REPORTER, "evidence", {"evidence": double_vote(height=2)})
    assert receipt.code == TxCode.INVALID_EVIDENCE and "too old" in receipt.log
    assert state.evidence == {} == replica.state.evidence


# ---- what readers are told -------------------------------------------------------------------------------

class _Role:
    def __init__(self, ledger):
        self.ledger = ledger

    def require_ready(self):
        return self


def test_rpc_and_cli_say_a_pruned_task_was_pruned_and_an_unknown_one_is_not_known(monkeypatch, capsys):
    chain = market()
    task_id = paid_task(chain)
    run_until(chain, lambda: task_id not in chain.ledger.state.tasks, limit=RETENTION_S + 2)
    methods = LedgerMethods(_Role(chain.ledger))
    with pytest.raises(RpcError) as err:
        asyncio.run(methods.dkb_getTask(task_id.hex()))
    assert err.value.code == RESOURCE_NOT_FOUND and err.value.data["pruned"] is True
    assert err.value.message == retention.pruned_task_message(task_id, RETENTION_S)
    assert f"task {task_id.hex()} ended more than 20 s ago and its record was pruned" in err.value.message
    assert "fetch within the retention" in err.value.message
    assert asyncio.run(methods.dkb_getTask("ab" * 32)) is None

    def rpc(url, method, *args):   # the RPC call as cli/rpc_call.py makes it: an error answer is a CliError
        try:
            return asyncio.run(getattr(methods, method)(*args))
        except RpcError as exc:
            raise cli.task.CliError(f"{method}: {exc.message}") from None

    monkeypatch.setattr(cli.task, "_rpc", rpc)
    assert main(["task", "show", task_id.hex()]) != 0
    assert retention.pruned_task_message(task_id, RETENTION_S) in capsys.readouterr().err
    assert main(["task", "show", "ab" * 32]) != 0
    assert retention.unknown_task_message("ab" * 32) in capsys.readouterr().err

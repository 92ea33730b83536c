"""Issue 10 on the ledger: reject_task, expiry of unassigned tasks, device-aware assignment, task
sources, and the task's result (ADRs 0151, 0152)."""
import pytest
from test_ledger_kit import CHAIN, Chain, answer_slot, ident, run_scheduled_draws

from consensus.encoding import decode, encode
from consensus.genesis import Genesis, GenesisValidator, Params, hashed_params
from consensus.ledger_events import task_events
from consensus.state.records import Task, TaskStatus
from consensus.state.tasks import task_id_for
from consensus.tx import MAX_REASON_CHARS, build_tx, relay_receipt_signing_bytes
from consensus.txcodes import TxCode, TxError

OWNER, W1, W2, W3, G1, G2, G3, OUTSIDER, RELAY = (ident(i) for i in range(1, 10))
PRICE = 10_000
REJECT_FEE = 30
ARTIFACT = "ab" * 32
CPU, GPU = "cpu-x86-64-avx2/torch-2.13.0", "cuda-nvidia-geforce-rtx-4090-cc8.9-cuda12.4/torch-2.13.0"
SPEC = {"model": "pt2", "dataset": "file", "workers": 3, "sync_mode": "allreduce", "codec": "int8",
        "hyperparams": {"model_artifact": ARTIFACT, "dataset_artifact": "cd" * 32, "steps": 100, "lr": "0.001"},
        "profile": CPU, "segments": 8}
SOURCES = ["/ip4/203.0.113.7/tcp/4001/p2p/" + OWNER.peer_id, "/ip4/127.0.0.1/udp/4001/quic-v1"]


def params(**overrides):
    base = {"task_min_s": 12, "task_slack_s": 0, "audit_window_s": 2, "min_fee": 0,
            "task_assign_s": 5, "reject_fee": REJECT_FEE, "audits_per_worker": 0}
    return Params(**{**base, **overrides})


def hardware(gpu=""):
    return {"cpu_cores": 4, "ram_mb": 8000, "gpu": gpu, "gpu_mem_mb": 24_000 if gpu else 0, "bandwidth_mbps": 100,
            "profiles": [CPU, GPU] if gpu else [CPU]}


def register(chain, who, bond, gpu=""):
    chain.ok(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                    "hardware": hardware(gpu)})
    chain.ok(who, "bond", {"amount": bond})


def make_chain(cpu=(W1, W2, W3), gpu=(), **overrides):
    chain = Chain(params=params(**overrides), balances={ident(i).peer_id: 1_000_000 for i in range(1, 10)})
    for i, who in enumerate(cpu):
        register(chain, who, 3000 - 100 * i)
    for i, who in enumerate(gpu):
        register(chain, who, 1000 - 100 * i, gpu="RTX 4090")   # less stake than any CPU node
    return chain


def submit(chain, price=PRICE, **extra):
    nonce = chain.ledger.nonce(OWNER.peer_id)
    profile = GPU if extra.get("device") == "cuda" else CPU     # what the CLI names (ADR 0188)
    result = chain.block([chain.tx(OWNER, "submit_task", {**SPEC, "price": price, "profile": profile, **extra})])
    assert result.receipts[0].code == TxCode.OK, result.receipts[0]
    return task_id_for(OWNER.peer_id, nonce), result


def task(chain, task_id):
    return chain.ledger.state.tasks[task_id]


DEFAULT_REASON = "Untrainable: mat1 and mat2 shapes cannot be multiplied (64x10 and 64x64)"


def reject(chain, who, task_id, reason=DEFAULT_REASON):
    return chain.run(who, "reject_task", {"task_id": task_id, "reason": reason})


def commit(chain, who, task_id, result_hash=b"\x22" * 32):
    return chain.run(who, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                            "result_hash": result_hash, "segments": 8})


def balances(chain, *people):
    return {p.peer_id: chain.ledger.balance(p.peer_id) for p in people}


def events_of(result, name):
    return [event for event in task_events(result) if event["event"] == name]


# ---- payloads ---------------------------------------------------------------------------------

def test_submit_task_sources_and_device_are_optional_and_recorded():
    chain = make_chain()
    plain, _ = submit(chain)
    assert task(chain, plain).sources == [] and task(chain, plain).spec["device"] == "cpu"
    chain2 = make_chain()
    with_sources, _ = submit(chain2, sources=SOURCES, device="cpu")
    info = chain2.ledger.task_info(with_sources)
    assert info["sources"] == SOURCES and info["device"] == "cpu"
    assert info["spec"]["hyperparams"]["model_artifact"] == ARTIFACT


@pytest.mark.parametrize("extra, why", [
    ({"sources": ["not-a-multiaddr"]}, "not a multiaddr"),
    ({"sources": ["/ip4/999.1.1.1/tcp/1"]}, "not a multiaddr"),
    ({"sources": ["/ip4/1.2.3.4/tcp/1 "]}, "printable"),
    ({"sources": ["/ip4/1.2.3.4/tcp/1"] * 2}, "must not repeat"),
    ({"sources": [f"/ip4/10.0.0.{i}/tcp/1" for i in range(9)]}, "at most 8"),
    ({"sources": ["/dns4/" + "a" * 300 + "/tcp/1"]}, "1..256"),
    ({"sources": "/ip4/1.2.3.4/tcp/1"}, "at most 8"),
    ({"device": "tpu"}, "must be one of"),
    ({"device": ""}, "must be one of"),
    ({"hyperparams": {"Model": "x"}}, "a-z, 0-9"),
    ({"hyperparams": {"lr": b"\x00"}}, "integer or text"),
    ({"hyperparams": {"lr": "1" * 513}}, "at most 512"),
    ({"hyperparams": {"steps": 2**64}}, "64 bits"),
    ({"hyperparams": {f"k{i}": 1 for i in range(49)}}, "at most 48"),
    ({"hyperparams": {"nested": {"a": 1}}}, "integer or text"),
    ({"extra_field": 1}, "unexpected fields"),
])
def test_bad_submit_payloads_are_refused(extra, why):
    with pytest.raises(TxError) as err:
        build_tx(OWNER, CHAIN, 0, "submit_task", {**SPEC, "price": PRICE, **extra}, 0)
    assert err.value.code == TxCode.BAD_PAYLOAD and why in err.value.message


def test_submit_without_a_required_field_is_still_refused():
    payload = {**SPEC, "price": PRICE}
    del payload["codec"]
    with pytest.raises(TxError, match="missing fields"):
        build_tx(OWNER, CHAIN, 0, "submit_task", payload, 0)


@pytest.mark.parametrize("reason, why", [
    ("", "1..500"), ("x" * (MAX_REASON_CHARS + 1), "1..500"), ("bad\x00byte", "control"),
    ("esc\x1b[31m", "control"), ("c1\x85", "control"), (7, "1..500"),
])
def test_bad_reject_reasons_are_refused(reason, why):
    with pytest.raises(TxError) as err:
        build_tx(W1, CHAIN, 0, "reject_task", {"task_id": b"\x01" * 32, "reason": reason}, 0)
    assert err.value.code == TxCode.BAD_PAYLOAD and why in err.value.message


def test_a_long_unicode_reason_with_newlines_is_accepted():
    reason = "Untrainable:\n\tunsupported op aten::fft_rfft — «ошибка»" + "é" * 400
    tx = build_tx(W1, CHAIN, 0, "reject_task", {"task_id": b"\x01" * 32, "reason": reason}, 0)
    assert tx.payload["reason"] == reason


# ---- reject_task ------------------------------------------------------------------------------

def test_majority_rejection_refunds_owner_minus_fee_and_frees_workers():
    chain = make_chain()
    task_id, _ = submit(chain)
    t = task(chain, task_id)
    assert t.status == TaskStatus.ASSIGNED and t.workers == sorted(p.peer_id for p in (W1, W2, W3))
    before = balances(chain, OWNER, W1, W2, W3)
    reps = {w: chain.ledger.node_info(w)["reputation"] for w in t.workers}
    assert reject(chain, W1, task_id).code == TxCode.OK
    assert t.status == TaskStatus.ASSIGNED                  # one of three: a minority, the task goes on
    receipt = chain.block([chain.tx(W2, "reject_task", {"task_id": task_id, "reason": "NaN loss at step 1"})])
    assert receipt.receipts[0].code == TxCode.OK
    assert t.status == TaskStatus.REJECTED and t.escrow == 0
    each = REJECT_FEE // 2
    after = balances(chain, OWNER, W1, W2, W3)
    assert after[OWNER.peer_id] == before[OWNER.peer_id] + PRICE - 2 * each
    assert after[W1.peer_id] == before[W1.peer_id] + each
    assert after[W2.peer_id] == before[W2.peer_id] + each
    assert after[W3.peer_id] == before[W3.peer_id]          # did not reject: no fee, no penalty
    assert t.payouts == {OWNER.peer_id: PRICE - 2 * each, W1.peer_id: each, W2.peer_id: each}
    for worker in t.workers:
        info = chain.ledger.node_info(worker)
        assert info["active_tasks"] == 0 and info["reputation"] == reps[worker]
    info = chain.ledger.task_info(task_id)
    assert info["rejections"] == {W1.peer_id: DEFAULT_REASON, W2.peer_id: "NaN loss at step 1"}
    assert "NaN loss at step 1" in info["reason"] and info["status"] == "rejected"
    [event] = events_of(receipt, "rejected")
    assert event["rejections"] == info["rejections"] and event["payouts"] == info["payouts"]
    # the rejected task is over: no finalize, commit, cancel, or further rejection
    assert chain.run(OUTSIDER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE
    assert commit(chain, W3, task_id).code == TxCode.BAD_STATE
    assert chain.run(OWNER, "cancel_task", {"task_id": task_id}).code == TxCode.BAD_STATE
    assert reject(chain, W3, task_id).code == TxCode.BAD_STATE
    # the freed workers take the next task at once
    second, _ = submit(chain)
    assert task(chain, second).status == TaskStatus.ASSIGNED


def test_reject_fee_is_capped_by_the_escrow_and_its_remainder_goes_to_the_owner():
    chain = make_chain(cpu=(W1, W2), reject_fee=7)
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**SPEC, "workers": 2, "price": 5})
    task_id = task_id_for(OWNER.peer_id, nonce)
    before = balances(chain, OWNER, W1, W2)
    reject(chain, W1, task_id)
    reject(chain, W2, task_id)                   # 2 of 2: quorum is 2
    t = task(chain, task_id)
    assert t.status == TaskStatus.REJECTED
    assert t.payouts == {W1.peer_id: 2, W2.peer_id: 2, OWNER.peer_id: 1}   # fee min(7, 5) = 5, 2 each, 1 back
    after = balances(chain, OWNER, W1, W2)
    assert sum(after.values()) == sum(before.values()) + 5


def test_reject_rules_non_worker_after_commit_twice_and_wrong_status():
    chain = make_chain()
    task_id, _ = submit(chain)
    assert reject(chain, OUTSIDER, task_id).code == TxCode.UNAUTHORIZED
    assert reject(chain, OWNER, task_id).code == TxCode.UNAUTHORIZED
    assert commit(chain, W1, task_id).code == TxCode.OK
    assert reject(chain, W1, task_id).code == TxCode.BAD_STATE           # committed: too late to reject
    assert reject(chain, W2, task_id).code == TxCode.OK
    assert reject(chain, W2, task_id).code == TxCode.ALREADY_KNOWN
    assert commit(chain, W2, task_id).code == TxCode.BAD_STATE           # rejected: cannot commit after
    assert reject(chain, W1, b"\x09" * 32).code == TxCode.NOT_FOUND
    # a task still waiting for workers cannot be rejected
    chain2 = make_chain(cpu=(W1, W2))
    waiting, _ = submit(chain2)                                          # wants 3, only 2 exist
    assert task(chain2, waiting).status == TaskStatus.CREATED
    assert reject(chain2, W1, waiting).code == TxCode.UNAUTHORIZED


def test_minority_rejection_lets_the_committers_close_at_once_and_counts_as_no_show():
    chain = make_chain()
    task_id, _ = submit(chain)
    t = task(chain, task_id)
    assert reject(chain, W3, task_id).code == TxCode.OK
    assert commit(chain, W1, task_id).code == TxCode.OK
    assert commit(chain, W2, task_id).code == TxCode.OK
    assert t.status == TaskStatus.COMMITTED                  # nobody left to wait for
    chain.empty_blocks(2)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert t.status == TaskStatus.PAID
    assert W3.peer_id not in t.payouts
    assert chain.ledger.node_info(W3.peer_id)["reputation"] == -5   # as any worker that did not commit
    assert chain.ledger.node_info(W1.peer_id)["reputation"] == 1


def test_rejection_after_the_commit_deadline_is_refused():
    chain = make_chain()
    task_id, _ = submit(chain)
    chain.empty_blocks(13)
    assert reject(chain, W1, task_id).code == TxCode.BAD_STATE


def test_relay_claims_are_paid_when_a_task_is_rejected():
    chain = make_chain()
    chain.ok(RELAY, "register_node", {"roles": ["relay"], "listen_addrs": [], "relay_addrs": [],
                                      "hardware": hardware()})
    chain.ok(RELAY, "bond", {"amount": chain.params.min_relay_stake})
    task_id, _ = submit(chain)
    receipt = {"relay": RELAY.peer_id, "src": W1.peer_id, "dst": OWNER.peer_id, "payer": OWNER.peer_id,
               "session": b"s" * 16, "bytes_total": 4096, "amount_total": 40, "task_id": task_id}
    message = relay_receipt_signing_bytes(CHAIN, receipt)
    chain.ok(RELAY, "relay_receipt", {"receipt": receipt, "src_sig": W1.sign(message),
                                      "dst_sig": OWNER.sign(message)})
    reject(chain, W1, task_id)
    reject(chain, W2, task_id)
    t = task(chain, task_id)
    assert t.payouts[RELAY.peer_id] == 40
    assert t.payouts[OWNER.peer_id] == PRICE - 40 - 2 * (REJECT_FEE // 2)


def test_cancel_still_refunds_a_waiting_task():
    chain = make_chain(cpu=(W1,))
    task_id, _ = submit(chain)
    before = chain.ledger.balance(OWNER.peer_id)
    chain.ok(OWNER, "cancel_task", {"task_id": task_id})
    assert task(chain, task_id).status == TaskStatus.CANCELLED
    assert chain.ledger.balance(OWNER.peer_id) == before + PRICE


# ---- expiry -----------------------------------------------------------------------------------

def test_unassignable_task_expires_refunded_with_a_reason():
    chain = make_chain(cpu=(W1, W2), gpu=(G1,))
    before = chain.ledger.balance(OWNER.peer_id)
    task_id, submitted = submit(chain, device="cuda")
    t = task(chain, task_id)
    created = t.created_height
    while chain.ledger.height < created + 4:
        chain.block()
    assert t.status == TaskStatus.CREATED
    result = chain.block()                                   # created + task_assign_timeout
    assert t.status == TaskStatus.EXPIRED and t.escrow == 0
    assert t.reason == (f"not assigned within 5 s: needs 3 compute nodes for device cuda running profile {GPU}; "
                        "1 eligible")
    assert chain.ledger.balance(OWNER.peer_id) == before      # every token back (min_fee 0)
    assert t.payouts == {OWNER.peer_id: PRICE}
    [event] = events_of(result, "expired")
    assert event["reason"] == t.reason and event["task_id"] == task_id.hex()
    assert task_id not in chain.ledger.state.open_tasks
    assert chain.ledger.task_info(task_id)["reason"] == t.reason
    assert chain.run(OWNER, "cancel_task", {"task_id": task_id}).code == TxCode.BAD_STATE


def test_expiry_reason_counts_busy_nodes():
    chain = make_chain(cpu=(W1, W2))
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**SPEC, "workers": 1, "price": PRICE})     # takes W1
    first = task_id_for(OWNER.peer_id, nonce)
    assert task(chain, first).status == TaskStatus.ASSIGNED
    task_id, _ = submit(chain)                               # wants 3: 2 exist, 1 busy
    chain.empty_blocks(5)
    assert task(chain, task_id).reason == ("not assigned within 5 s: needs 3 compute nodes for device cpu "
                                           f"running profile {CPU}; 2 eligible (1 busy with other tasks)")


def test_a_task_assigned_in_time_does_not_expire():
    chain = make_chain(cpu=(W1, W2))
    task_id, _ = submit(chain)
    chain.empty_blocks(2)
    register(chain, W3, 500)                                 # the third node arrives before the timeout
    t = task(chain, task_id)
    assert t.status == TaskStatus.ASSIGNED
    chain.empty_blocks(5)
    assert t.status == TaskStatus.ASSIGNED


# ---- devices ----------------------------------------------------------------------------------

def test_cuda_tasks_go_to_gpu_nodes_only():
    chain = make_chain(gpu=(G1, G2, G3))
    task_id, result = submit(chain, device="cuda")
    t = task(chain, task_id)
    assert t.workers == sorted(p.peer_id for p in (G1, G2, G3))   # despite the CPU nodes' larger stake
    assert t.device == "cuda"
    [event] = events_of(result, "assigned")
    assert event["device"] == "cuda"


def test_cpu_tasks_take_the_heaviest_nodes_whatever_their_hardware():
    chain = make_chain(gpu=(G1,))
    task_id, _ = submit(chain)
    assert task(chain, task_id).workers == sorted(p.peer_id for p in (W1, W2, W3))
    assert task(chain, task_id).device == "cpu"


def test_any_trains_on_the_device_of_the_profile_the_owner_named():
    chain = make_chain(gpu=(G1, G2, G3))
    task_id, _ = submit(chain, device="any", profile=GPU)    # the CLI found three GPUs of one class
    t = task(chain, task_id)
    assert t.device == "cuda" and set(t.workers) == {G1.peer_id, G2.peer_id, G3.peer_id}
    assert chain.ledger.task_info(task_id)["device"] == "cuda"
    assert t.spec["device"] == "any"                         # what was asked stays in the spec

    chain = make_chain(gpu=(G1, G2, G3))                     # the portable profile: CPU kernels, GPU nodes or not
    task_id, _ = submit(chain, device="any")
    t = task(chain, task_id)
    assert t.device == "cpu" and set(t.workers) == {W1.peer_id, W2.peer_id, W3.peer_id}


def test_any_waits_for_its_profile_and_says_so_when_it_expires():
    chain = make_chain(cpu=(W1,), gpu=(G1,))
    task_id, _ = submit(chain, device="any")
    chain.empty_blocks(5)
    t = task(chain, task_id)
    assert t.status == TaskStatus.EXPIRED and t.device == "any"
    assert t.reason.endswith(f"needs 3 compute nodes for device cuda or cpu running profile {CPU}; 2 eligible")


# ---- result -----------------------------------------------------------------------------------

A, B = b"\xaa" * 32, b"\xbb" * 32


def test_result_is_the_hash_most_committers_agree_on():
    chain = make_chain()
    task_id, _ = submit(chain)
    assert chain.ledger.task_info(task_id)["result"] == ""
    commit(chain, W1, task_id, B)
    assert chain.ledger.task_info(task_id)["result"] == B.hex()          # the only one so far
    commit(chain, W2, task_id, A)
    assert chain.ledger.task_info(task_id)["result"] == B.hex()          # tie: committed first
    commit(chain, W3, task_id, A)
    assert chain.ledger.task_info(task_id)["result"] == A.hex()          # two agree
    chain.empty_blocks(2)
    result = chain.block([chain.tx(OUTSIDER, "finalize", {"task_id": task_id})])
    t = task(chain, task_id)
    assert t.status == TaskStatus.PAID and t.result == A
    assert chain.ledger.list_tasks(status="paid")[0]["result"] == A.hex()
    [event] = events_of(result, "finalized")
    assert event["result"] == A.hex()


def test_result_excludes_slashed_committers():
    chain = make_chain(cpu=(W1, W2, W3, OUTSIDER), audits_per_worker=1, audit_double_bps=0, stake_cover_bps=0)
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**SPEC, "workers": 2, "price": PRICE})
    task_id = task_id_for(OWNER.peer_id, nonce)
    t = task(chain, task_id)
    first, second = t.workers
    by_id = {p.peer_id: p for p in (W1, W2, W3, OUTSIDER)}
    commit(chain, by_id[first], task_id, B)                  # first to commit: leads a 1-1 tie
    commit(chain, by_id[second], task_id, A)
    assert chain.ledger.task_info(task_id)["result"] == B.hex()
    run_scheduled_draws(chain, task_id)                      # slots drawn beacon_delay blocks later (ADR 0202)
    [slot_of_first] = [slot for slot in t.slots if slot["worker"] == first]
    [verifier] = slot_of_first["verifiers"]
    assert answer_slot(chain, task_id, slot_of_first["slot"], verifier["verifier"], match=False, step=3).code \
        == TxCode.OK
    chain.empty_blocks(chain.params.dispute_s + 1)       # no dispute: guilty
    assert slot_of_first["outcome"] == "guilty"
    assert chain.ledger.task_info(task_id)["result"] == A.hex()          # convicted: not counted
    [other] = [slot for slot in t.slots if slot["worker"] == second]
    answer_slot(chain, task_id, other["slot"], other["verifiers"][0]["verifier"])
    chain.empty_blocks(2)
    chain.ok(W3 if W3.peer_id not in t.workers else OWNER, "finalize", {"task_id": task_id})
    assert t.status == TaskStatus.PAID and t.result == A
    assert t.payouts.get(first, 0) <= PRICE * chain.params.verifier_share_bps // 10_000   # at most a verifier's pay
    assert chain.ledger.stake_info(first)["slashed"] > 0 and chain.ledger.stake_info(second)["slashed"] == 0


# ---- records, genesis, events -----------------------------------------------------------------

def test_task_records_stored_before_the_new_fields_still_load():
    t = Task(OWNER.peer_id, 1, {"model": "m"}, 5, 3)
    old = decode(t.encode())[:Task.V1_FIELDS]
    loaded = Task.decode(encode(old))
    assert loaded.sources == [] and loaded.device == "cpu" and loaded.rejections == {}
    assert loaded.reason == "" and loaded.result == b"" and loaded.price == 5


def test_genesis_hash_of_an_old_file_is_unchanged_and_new_params_load():
    validators = (GenesisValidator(ident(0).peer_id, 10_000),)
    genesis = Genesis("c", 0, {}, validators, Params())
    obj = genesis.to_obj()
    assert "task_assign_timeout" in obj["params"]
    for name in ("task_assign_timeout", "reject_fee"):
        del obj["params"][name]                               # a genesis file written before them
    old = Genesis.from_obj(obj)
    assert old.params == Params() and old.hash == genesis.hash
    assert "task_assign_timeout" not in hashed_params(Params())
    changed = Genesis("c", 0, {}, validators, Params(reject_fee=11))
    assert changed.hash != genesis.hash
    with pytest.raises(ValueError, match="task_assign_s"):
        Params(task_assign_s=0).validate()

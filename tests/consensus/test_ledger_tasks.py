"""Task lifecycle on chain: assignment, commits, finalize payouts (audit slots: test_audit_slots.py),
cancellation, timeouts, and relay receipts paid directly or from a task's relay budget."""
import pytest
from test_ledger_kit import CHAIN, Chain, ident

from consensus.state.records import TaskStatus
from consensus.state.tasks import task_id_for
from consensus.tx import relay_receipt_signing_bytes
from consensus.txcodes import TxCode

OWNER, W1, W2, W3, VERIFIER, VERIFIER2, RELAY, OUTSIDER = (ident(i) for i in range(1, 9))
PRICE = 10_000
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
SPEC = {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"lr": "0.01", "steps": 100},
        "workers": 2, "sync_mode": "diloco", "codec": "int8", "profile": PROFILE, "segments": 8}


def hardware(bandwidth):
    return {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": bandwidth,
            "profiles": [PROFILE]}


def register(chain, who, roles, bond=0, bandwidth=100):
    chain.ok(who, "register_node", {"roles": roles, "listen_addrs": [], "relay_addrs": [],
                                    "hardware": hardware(bandwidth)})
    if bond:
        chain.ok(who, "bond", {"amount": bond})


def setup_market(chain):
    register(chain, W1, ["compute"], bond=2000)
    register(chain, W2, ["compute"], bond=1500)
    register(chain, W3, ["compute"], bond=200)
    chain.ok(VERIFIER, "bond", {"amount": 500})
    chain.ok(VERIFIER2, "bond", {"amount": 500})
    register(chain, RELAY, ["relay"], bond=100)   # min_relay_stake (ADR 0165)


def submit(chain, spec=SPEC, price=PRICE):
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**spec, "price": price})
    return task_id_for(OWNER.peer_id, nonce)


def task(chain, task_id):
    return chain.ledger.state.tasks[task_id]


def commit(chain, who, task_id, segments=8):
    return chain.run(who, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                            "result_hash": b"\x22" * 32, "segments": segments})


def audit(chain, who, task_id, slot, match=True):
    return chain.run(who, "audit_result", {"task_id": task_id, "slot": slot, "match": match,
                                           "evidence": b"\xe0" * 32, "step": 0, "blinding": b"\x00" * 32})


@pytest.fixture
def market():
    chain = Chain()
    setup_market(chain)
    return chain


def test_happy_path_assign_commit_finalize(market):
    """Without audit slots (the kit's audits_per_worker=0; test_audit_slots.py covers them) the
    workers are paid after the audit window and the unused verifier pool goes back to the owner."""
    chain = market
    owner_before = chain.ledger.balance(OWNER.peer_id)
    task_id = submit(chain)
    t = task(chain, task_id)
    assert t.status == TaskStatus.ASSIGNED
    assert t.workers == sorted([W1.peer_id, W2.peer_id])  # the two highest-stake compute nodes
    assert chain.ledger.balance(OWNER.peer_id) == owner_before - PRICE
    assert commit(chain, W1, task_id).code == TxCode.OK
    assert t.status == TaskStatus.RUNNING
    assert commit(chain, W2, task_id).code == TxCode.OK
    assert t.status == TaskStatus.COMMITTED and t.slots == []   # no slots: nothing to draw (ADR 0202)
    assert chain.run(OUTSIDER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE   # window open
    chain.empty_blocks(1)
    balances = {p.peer_id: chain.ledger.balance(p.peer_id) for p in (W1, W2, VERIFIER, OWNER)}
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert t.status == TaskStatus.PAID and t.escrow == 0
    worker_share = (PRICE - 500 - 1000) // 2
    assert chain.ledger.balance(W1.peer_id) == balances[W1.peer_id] + worker_share
    assert chain.ledger.balance(W2.peer_id) == balances[W2.peer_id] + worker_share
    assert chain.ledger.balance(VERIFIER.peer_id) == balances[VERIFIER.peer_id]
    assert chain.ledger.balance(OWNER.peer_id) == balances[OWNER.peer_id] + 1000 + 500  # relay budget, pool
    assert chain.ledger.node_info(W1.peer_id)["reputation"] == 1
    assert chain.ledger.node_info(W1.peer_id)["active_tasks"] == 0
    assert chain.run(OUTSIDER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE
    listed = chain.ledger.list_tasks(status="paid")
    assert [entry["task_id"] for entry in listed] == [task_id.hex()]


def test_permission_and_state_errors(market):
    chain = market
    unknown = b"\x00" * 32
    assert commit(chain, W1, unknown).code == TxCode.NOT_FOUND
    task_id = submit(chain)
    assert commit(chain, W3, task_id).code == TxCode.UNAUTHORIZED
    assert audit(chain, VERIFIER, task_id, 0).code == TxCode.BAD_STATE  # nothing committed yet
    assert commit(chain, W1, task_id).code == TxCode.OK
    assert commit(chain, W1, task_id).code == TxCode.ALREADY_KNOWN
    assert chain.run(OWNER, "cancel_task", {"task_id": task_id}).code == TxCode.BAD_STATE
    assert commit(chain, W2, task_id).code == TxCode.OK
    assert audit(chain, VERIFIER, task_id, 0).code == TxCode.BAD_PAYLOAD   # no slots drawn (audits off)
    assert chain.run(OWNER, "submit_task", {**SPEC, "price": 10**9}).code == TxCode.INSUFFICIENT_FUNDS


def test_cancel_refunds_only_while_unassigned():
    chain = Chain()  # no compute nodes: the task stays created
    before = chain.ledger.balance(OWNER.peer_id)
    task_id = submit(chain)
    assert task(chain, task_id).status == TaskStatus.CREATED
    assert chain.run(W1, "cancel_task", {"task_id": task_id}).code == TxCode.UNAUTHORIZED
    chain.ok(OWNER, "cancel_task", {"task_id": task_id})
    assert task(chain, task_id).status == TaskStatus.CANCELLED
    assert chain.ledger.balance(OWNER.peer_id) == before
    assert chain.run(OWNER, "cancel_task", {"task_id": task_id}).code == TxCode.BAD_STATE


def test_task_waits_for_enough_free_workers_and_owner_is_never_assigned(market):
    chain = market
    register(chain, OWNER, ["compute"], bond=5000)  # the owner is the strongest node but must be skipped
    first = submit(chain, {**SPEC, "workers": 3})
    assert OWNER.peer_id not in task(chain, first).workers
    assert task(chain, first).workers == sorted([W1.peer_id, W2.peer_id, W3.peer_id])
    second = submit(chain, {**SPEC, "workers": 1})  # every other compute node is busy
    assert task(chain, second).status == TaskStatus.CREATED
    for worker in (W1, W2, W3):
        commit(chain, worker, first)
    chain.empty_blocks(2)
    chain.ok(OUTSIDER, "finalize", {"task_id": first})  # audit window passed without audits
    assert task(chain, first).status == TaskStatus.PAID
    assert task(chain, second).status == TaskStatus.ASSIGNED
    assert task(chain, second).workers == [W1.peer_id]  # highest weight among the free nodes


def test_timeout_without_commits_refunds_the_owner(market):
    chain = market
    before = chain.ledger.balance(OWNER.peer_id)
    task_id = submit(chain)
    commit(chain, W1, task_id)
    assert chain.run(OUTSIDER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE
    chain.empty_blocks(chain.params.task_min_s)   # blocks of 1 s
    assert commit(chain, W2, task_id).code == TxCode.BAD_STATE  # deadline passed
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    worker_share = (PRICE - 1500) // 2
    assert chain.ledger.balance(OWNER.peer_id) == before - worker_share
    assert chain.ledger.node_info(W2.peer_id)["reputation"] == -5


def receipt_payload(src, dst, payer, amount_total, bytes_total=1 << 20, session=b"s" * 16, task_id=b"",
                    signers=None):
    receipt = {"relay": RELAY.peer_id, "src": src.peer_id, "dst": dst.peer_id, "payer": payer.peer_id,
               "session": session, "bytes_total": bytes_total, "amount_total": amount_total, "task_id": task_id}
    message = relay_receipt_signing_bytes(CHAIN, receipt)
    a, b = signers or (src, dst)
    return {"receipt": receipt, "src_sig": a.sign(message), "dst_sig": b.sign(message)}


def test_relay_receipt_paid_by_endpoint_with_replay_protection(market):
    chain = market
    relay_before = chain.ledger.balance(RELAY.peer_id)
    payer_before = chain.ledger.balance(W1.peer_id)
    chain.ok(RELAY, "relay_receipt", receipt_payload(W1, W2, W1, 40))
    assert chain.run(RELAY, "relay_receipt", receipt_payload(W1, W2, W1, 40)).code == TxCode.REPLAYED
    chain.ok(RELAY, "relay_receipt", receipt_payload(W1, W2, W1, 100, bytes_total=3 << 20))
    assert chain.ledger.balance(RELAY.peer_id) == relay_before + 100
    assert chain.ledger.balance(W1.peer_id) == payer_before - 100
    assert chain.run(RELAY, "relay_receipt", receipt_payload(W1, W2, W1, 120, bytes_total=1)).code \
        == TxCode.REPLAYED
    more = 4 << 20
    forged = receipt_payload(W1, W2, W1, 500, more, signers=(W1, W3))
    assert chain.run(RELAY, "relay_receipt", forged).code == TxCode.BAD_SIGNATURE
    assert chain.run(W1, "relay_receipt", receipt_payload(W1, W2, W1, 900, more)).code == TxCode.UNAUTHORIZED
    assert chain.run(RELAY, "relay_receipt", receipt_payload(W1, W2, W3, 900, more)).code == TxCode.BAD_PAYLOAD
    assert chain.run(RELAY, "relay_receipt", receipt_payload(W1, W2, W1, 10**9, more)).code \
        == TxCode.INSUFFICIENT_FUNDS


def test_relay_receipt_for_a_task_is_paid_from_its_budget_at_finalize(market):
    chain = market
    task_id = submit(chain)
    chain.ok(RELAY, "relay_receipt", receipt_payload(W1, W2, OWNER, 600, task_id=task_id))
    over = receipt_payload(W1, W2, OWNER, 1100, session=b"t" * 16, task_id=task_id)
    assert chain.run(RELAY, "relay_receipt", over).code == TxCode.INSUFFICIENT_FUNDS  # budget 1000, 600 used
    wrong_payer = receipt_payload(W1, W2, W1, 10, session=b"u" * 16, task_id=task_id)
    assert chain.run(RELAY, "relay_receipt", wrong_payer).code == TxCode.BAD_PAYLOAD
    relay_before = chain.ledger.balance(RELAY.peer_id)
    commit(chain, W1, task_id)
    commit(chain, W2, task_id)
    chain.empty_blocks(2)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert chain.ledger.balance(RELAY.peer_id) == relay_before + 600
    assert task(chain, task_id).payouts[OWNER.peer_id] == 400 + 500  # budget left + unclaimed verifier pool


def test_relay_receipt_needs_the_relays_own_stake(market):
    chain = market
    chain.ok(RELAY, "unbond", {"amount": 1})
    receipt = chain.run(RELAY, "relay_receipt", receipt_payload(W1, W2, W1, 40))
    assert receipt.code == TxCode.UNAUTHORIZED and "min_relay_stake" in receipt.log
    chain.ok(RELAY, "bond", {"amount": 1})
    chain.ok(RELAY, "relay_receipt", receipt_payload(W1, W2, W1, 40))

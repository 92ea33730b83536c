"""Supply invariant and replica determinism under random transaction sequences (hypothesis)."""
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_ledger_kit import CHAIN, Chain, ident

from consensus.genesis import Params
from consensus.state.records import TaskStatus
from consensus.state.supply import SupplyInvariantError, check_supply
from consensus.state.tasks import task_id_for
from consensus.tx import relay_receipt_signing_bytes, serve_receipt_signing_bytes

PEOPLE = [ident(i) for i in range(1, 7)]
CPU_PROFILE, GPU_PROFILE = "cpu-x86-64-avx2/torch-2.13.0", "cuda-a100-cc8.0-cuda12.4/torch-2.13.0"
HW = {"cpu_cores": 2, "ram_mb": 1000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 50, "profiles": [CPU_PROFILE]}
GPU_HW = {**HW, "gpu": "A100", "gpu_mem_mb": 40_000, "profiles": [CPU_PROFILE, GPU_PROFILE]}


def random_tx(draw, chain, submitted):
    who = draw(st.sampled_from(PEOPLE))
    other = draw(st.sampled_from(PEOPLE))
    amount = draw(st.integers(1, 400_000))
    task_id = draw(st.sampled_from(submitted)) if submitted and draw(st.booleans()) else b"\x07" * 32
    slot_index = draw(st.integers(0, 5))
    match = draw(st.booleans())
    evidence = draw(st.sampled_from([b"\xe0" * 32, b"\xe1" * 32]))
    kind = draw(st.sampled_from(["transfer", "bond", "unbond", "register_node", "submit_task", "cancel_task",
                                 "commit_result", "reject_task", "audit_commit", "audit_result",
                                 "dispute", "referee_commit", "referee_vote",
                                 "finalize", "relay_receipt", "serve_deposit", "serve_unlock", "serve_withdraw",
                                 "serve_receipt"]))
    device = draw(st.sampled_from(["cpu", "cuda", "any"]))
    profile = GPU_PROFILE if device == "cuda" or (device == "any" and draw(st.booleans())) else CPU_PROFILE
    payloads = {
        "transfer": {"to": other.peer_id, "amount": amount},
        "bond": {"amount": amount},
        "unbond": {"amount": amount},
        "register_node": {"roles": draw(st.sampled_from([["compute"], ["relay"], ["compute", "relay"]])),
                          "listen_addrs": [], "relay_addrs": [], "hardware": draw(st.sampled_from([HW, GPU_HW]))},
        "submit_task": {"model": "m", "dataset": "d", "hyperparams": {}, "workers": draw(st.integers(1, 3)),
                        "sync_mode": "allreduce", "codec": "fp16", "price": amount,
                        "device": device, "profile": profile, "segments": 4},
        "cancel_task": {"task_id": task_id},
        "commit_result": {"task_id": task_id, "segments_root": b"\x01" * 32, "result_hash": b"\x02" * 32,
                          "segments": 4},
        "audit_result": {"task_id": task_id, "slot": slot_index, "match": match, "evidence": evidence,
                         "step": 0 if match else draw(st.integers(0, 3)), "blinding": evidence},
        "audit_commit": {"task_id": task_id, "slot": slot_index, "commitment": evidence},
        "reject_task": {"task_id": task_id, "reason": "untrainable"},
        "dispute": {"task_id": task_id, "slot": slot_index},
        "referee_commit": {"task_id": task_id, "slot": slot_index, "commitment": evidence},
        "referee_vote": {"task_id": task_id, "slot": slot_index, "match": match, "evidence": evidence,
                         "blinding": evidence},
        "finalize": {"task_id": task_id},
        "serve_deposit": {"amount": amount},
        "serve_unlock": {},
        "serve_withdraw": {"amount": amount},
    }
    task = chain.ledger.state.tasks.get(task_id)
    by_id = {p.peer_id: p for p in PEOPLE}
    if task is not None and task.workers and kind in ("commit_result", "reject_task"):
        who = by_id[draw(st.sampled_from(task.workers))]  # steer toward transactions that succeed
    if task is not None and task.slots and kind in ("audit_commit", "audit_result", "dispute", "referee_commit",
                                                             "referee_vote"):
        slot = task.slots[slot_index % len(task.slots)]
        payloads[kind]["slot"] = slot["slot"]
        verifiers = [v["verifier"] for v in slot["verifiers"]]
        parties = {"audit_commit": verifiers, "audit_result": verifiers, "dispute": [slot["worker"]],
                   "referee_commit": [r["referee"] for r in slot["referees"]],
                   "referee_vote": [r["referee"] for r in slot["referees"]]}[kind]
        parties = [peer_id for peer_id in parties if peer_id in by_id]
        if parties:
            who = by_id[draw(st.sampled_from(parties))]
    if kind == "relay_receipt":
        src, dst = draw(st.permutations(PEOPLE))[:2]
        receipt = {"relay": who.peer_id, "src": src.peer_id, "dst": dst.peer_id, "payer": src.peer_id,
                   "session": b"x" * 16, "bytes_total": amount, "amount_total": amount, "task_id": b""}
        message = relay_receipt_signing_bytes(CHAIN, receipt)
        payload = {"receipt": receipt, "src_sig": src.sign(message), "dst_sig": dst.sign(message)}
    elif kind == "serve_receipt":
        receipt = {"session": b"s" * 16, "server": who.peer_id, "client": other.peer_id, "model": "m",
                   "tokens": amount, "flops": amount, "amount": amount, "seq": draw(st.integers(1, 3)),
                   "transcript": b"\x00" * 32}
        message = serve_receipt_signing_bytes(CHAIN, receipt)
        payload = {"receipt": receipt, "client_sig": other.sign(message), "server_sig": who.sign(message)}
    else:
        payload = payloads[kind]
    fee = draw(st.integers(0, 50))
    if kind == "submit_task":
        submitted.append(task_id_for(who.peer_id, chain.nonces.get(who.peer_id, chain.ledger.nonce(who.peer_id))))
    return chain.tx(who, kind, payload, fee)


def market_chain() -> Chain:
    """A chain where four of the accounts are bonded compute nodes, so tasks get assigned."""
    chain = Chain(balance=500_000, params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2,
                                                  min_fee=0,
                                                 task_assign_s=6, reject_fee=25, audit_answer_s=3,
                                                 dispute_s=2, stake_cover_bps=0))
    chain.block([tx for i, p in enumerate(PEOPLE[:4]) for tx in (
        chain.tx(p, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                      "hardware": GPU_HW if i % 2 else HW}),
        chain.tx(p, "bond", {"amount": 1_000}))])
    return chain


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_supply_conserved_and_replicas_agree(data):
    chain, replica = market_chain(), market_chain()
    submitted: list[bytes] = []
    for _ in range(data.draw(st.integers(1, 12))):
        txs = [random_tx(data.draw, chain, submitted) for _ in range(data.draw(st.integers(0, 6)))]
        result = chain.block(txs)  # Chain.block checks the supply invariant after every block
        again = replica.block(txs)
        assert result.app_hash == again.app_hash
        assert [r.code for r in result.receipts] == [r.code for r in again.receipts]
        for task in chain.ledger.state.tasks.values():   # an ended task holds nothing, a live one its price
            assert (task.escrow == 0) == (task.status in TaskStatus.FINAL), task
    assert chain.ledger.full_state_hash() == replica.ledger.full_state_hash()


def test_checker_detects_created_or_destroyed_tokens():
    chain = Chain()
    chain.ledger.state.accounts[PEOPLE[0].peer_id].balance += 1
    try:
        chain.ledger.check_invariants()
    except SupplyInvariantError as exc:
        assert "supply" in str(exc)
    else:
        raise AssertionError("minted token not detected")
    chain.ledger.state.accounts[PEOPLE[0].peer_id].balance -= 2
    try:
        check_supply(chain.ledger.state, chain.genesis.total_supply)
    except SupplyInvariantError:
        pass
    else:
        raise AssertionError("burned token not detected")


def test_random_sequences_reach_task_lifecycle_states():
    """Guards the property test above against exercising only rejections."""
    seen = set()

    @settings(max_examples=15, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def explore(data):
        chain = market_chain()
        submitted: list[bytes] = []
        for _ in range(10):
            chain.block([random_tx(data.draw, chain, submitted) for _ in range(8)])
        seen.update(task.status for task in chain.ledger.state.tasks.values())

    explore()
    assert {"assigned", "running", "committed"} & seen, seen
    assert {"rejected", "expired"} & seen, seen

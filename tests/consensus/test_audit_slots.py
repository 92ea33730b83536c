"""Audit slots on the ledger (ADRs 0168, 0169): execution profiles and declared segments, slots drawn
when the commit phase closes, answers with evidence, redraws, disputes, referees, and who is paid
or slashed at finalize."""
import pytest
from test_ledger_kit import CHAIN, HONEST_EVIDENCE, Chain, answer_slot, ident, identity_of, run_scheduled_draws

from consensus.encoding import decode, encode
from consensus.genesis import Genesis, GenesisError, GenesisValidator, Params, hashed_params
from consensus.ledger_events import task_events
from consensus.state.ledger import Ledger
from consensus.state.records import Task, TaskStatus
from consensus.state.store import LedgerState
from consensus.state.tasks import task_id_for
from consensus.tx import build_tx
from consensus.txcodes import TxCode, TxError

OWNER, W1, W2 = ident(1), ident(2), ident(3)
VERIFIERS = [ident(i) for i in range(4, 10)]
DECOY = ident(10)
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
OTHER = "cuda-h100-cc9.0-cuda12.4/torch-2.13.0"
PRICE = 10_000
SEGMENTS = 4
FAKE = b"\xf0" * 32
SPEC = {"model": "mlp", "dataset": "digits", "hyperparams": {"steps": 40}, "workers": 2, "sync_mode": "allreduce",
        "codec": "int8", "price": PRICE}
WORKER_SHARE = (PRICE - 500 - 1000) // 2
POOL = 500
ANSWER_BLOCKS = 30


def params(**overrides):
    # stake_cover_bps 0: these workers bond far less than 10x their pay (test_stake_to_work_scales_with_pay)
    base = {"task_min_s": 12, "task_slack_s": 0, "audit_window_s": 2,
            "min_fee": 0, "audits_per_worker": 2,
            "audit_double_bps": 0, "audit_answer_s": ANSWER_BLOCKS, "dispute_s": 3, "referees": 3,
            "stake_cover_bps": 0, "beacon_delay": 2,
            "max_audit_share_bps": 10_000}   # no audit surcharge here (test_audit_cost.py has it)
    return Params(**{**base, **overrides})


def hardware(profiles=(PROFILE,)):
    return {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100,
            "profiles": list(profiles)}


def register(chain, who, role, bond, profiles=(PROFILE,)):
    chain.ok(who, "register_node", {"roles": [role], "listen_addrs": [], "relay_addrs": [],
                                    "hardware": hardware(profiles)})
    chain.ok(who, "bond", {"amount": bond})


def make_chain(verifiers=6, workers=(W1, W2), **overrides):
    chain = Chain(params=params(**overrides), balances={ident(i).peer_id: 1_000_000 for i in range(1, 16)})
    for who, bond in zip(workers, (3000, 2500)):
        register(chain, who, "compute", bond)
    for who in VERIFIERS[:verifiers]:
        register(chain, who, "verifier", 1000)
    return chain


def submit(chain, **extra):
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {**SPEC, "profile": PROFILE, "segments": SEGMENTS, **extra})
    return task_id_for(OWNER.peer_id, nonce)


def commit(chain, who, task_id, segments=SEGMENTS):
    return chain.run(who, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                            "result_hash": b"\x22" * 32, "segments": segments})


def committed_task(chain, **extra):
    """A task both workers committed to: its slots are drawn (``beacon_delay`` blocks after the commit
    phase closed, ADR 0202); the result of the block that drew them."""
    task_id = submit(chain, **extra)
    commit(chain, W1, task_id)
    chain.block([chain.tx(W2, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                                "result_hash": b"\x22" * 32, "segments": SEGMENTS})])
    return task_id, chain.ledger.state.tasks[task_id], run_draws(chain)


def run_draws(chain):
    """The blocks until the scheduled draws ran; the last one's result."""
    result = None
    for _ in range(chain.params.beacon_delay):
        result = chain.block()
    return result


def slots_of(task, worker):
    return [slot for slot in task.slots if slot["worker"] == worker.peer_id]


def vote(chain, task_id, slot, referee, match=True, evidence=HONEST_EVIDENCE):
    """``referee``'s sealed vote (referee_commit); every sealed vote whose slot then opens its votes is
    revealed in the next block (ADR 0210); then the blocks until a larger panel it calls for is drawn.
    Returns the commit's receipt."""
    receipt = chain.block([chain.seal_vote(identity_of(referee), task_id, slot, match, evidence)]).receipts[0]
    chain.reveal_all(task_id)
    run_scheduled_draws(chain, task_id)
    return receipt


def close_votes(chain, task_id):
    """Past the referee deadline: the silent referees' seats close, the sealed votes are revealed (ADR
    0210) and a larger panel a short vote calls for is drawn."""
    chain.empty_blocks(ANSWER_BLOCKS + 3)
    chain.reveal_all(task_id)
    run_scheduled_draws(chain, task_id)


def dispute(chain, worker, task_id, slot):
    """``worker`` disputes ``slot``; its referees are drawn beacon_delay blocks later (ADR 0202)."""
    chain.ok(worker, "dispute", {"task_id": task_id, "slot": slot})
    run_scheduled_draws(chain, task_id)


def answer_rest_honestly(chain, task_id, task):
    for slot in task.slots:
        for v in slot["verifiers"]:
            if slot["outcome"] == "pending" and v.get("commitment") is None:
                assert answer_slot(chain, task_id, slot["slot"], v["verifier"]).code == TxCode.OK


def slashed(chain, who):
    return chain.ledger.stake_info(who if isinstance(who, str) else who.peer_id)["slashed"]


# ---- schemas ---------------------------------------------------------------------------------

FULL = {**SPEC, "profile": PROFILE, "segments": SEGMENTS}


@pytest.mark.parametrize("payload", [
    {**FULL, "profile": "CPU"}, {**FULL, "profile": "a" * 97}, {**FULL, "profile": "cpu x"},
    {**FULL, "segments": 0}, {**FULL, "segments": 2**20 + 1},
    {**FULL, "profile": ""}, SPEC, {**SPEC, "segments": SEGMENTS}, {**SPEC, "profile": PROFILE},
])
def test_submit_task_profile_and_segments_are_required_and_checked(payload):
    with pytest.raises(TxError) as err:
        build_tx(OWNER, CHAIN, 0, "submit_task", payload)
    assert err.value.code == TxCode.BAD_PAYLOAD
    build_tx(OWNER, CHAIN, 0, "submit_task", {**FULL, "segments": 2**20})


@pytest.mark.parametrize("profiles", [[PROFILE] * 2, ["p"] * 9, [""], ["Bad"], ["x" * 97], "cpu"])
def test_node_profiles_are_checked(profiles):
    payload = {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
               "hardware": {**hardware(), "profiles": profiles}}
    with pytest.raises(TxError) as err:
        build_tx(W1, CHAIN, 0, "register_node", payload)
    assert err.value.code == TxCode.BAD_PAYLOAD


def test_audit_payloads_are_checked():
    base = {"task_id": b"\x01" * 32, "slot": 0, "match": False, "evidence": b"\x02" * 32, "step": 7,
            "blinding": b"\x03" * 32}
    build_tx(W1, CHAIN, 0, "audit_result", base)
    build_tx(W1, CHAIN, 0, "audit_commit", {"task_id": b"\x01" * 32, "slot": 0, "commitment": b"\x04" * 32})
    build_tx(W1, CHAIN, 0, "referee_vote", {k: v for k, v in base.items() if k != "step"})
    build_tx(W1, CHAIN, 0, "referee_commit", {"task_id": b"\x01" * 32, "slot": 0, "commitment": b"\x04" * 32})
    with pytest.raises(TxError):   # a vote is revealed with its blinding (ADR 0210)
        build_tx(W1, CHAIN, 0, "referee_vote", {k: v for k, v in base.items() if k not in ("step", "blinding")})
    build_tx(W1, CHAIN, 0, "dispute", {"task_id": b"\x01" * 32, "slot": 3})
    for bad in ({**base, "evidence": b"\x02" * 31}, {**base, "slot": -1}, {**base, "match": 1},
                {k: v for k, v in base.items() if k != "step"}, {**base, "worker": W2.peer_id},
                {**base, "blinding": b"\x03" * 31}):
        with pytest.raises(TxError):
            build_tx(W1, CHAIN, 0, "audit_result", bad)
    with pytest.raises(TxError):
        build_tx(W1, CHAIN, 0, "dispute", {"task_id": b"\x01" * 32})


# ---- profiles, segments, assignment ----------------------------------------------------------

def test_a_commitment_with_another_segment_count_is_refused():
    chain = make_chain()
    task_id = submit(chain)
    lazy = commit(chain, W1, task_id, segments=1)       # trained one segment of four, left
    assert lazy.code == TxCode.BAD_PAYLOAD and "declares 4 segments" in lazy.log
    assert commit(chain, W1, task_id).code == TxCode.OK


def test_workers_and_verifiers_run_the_tasks_profile():
    chain = make_chain()
    register(chain, DECOY, "compute", 9000, profiles=(OTHER,))   # the strongest node, another profile
    task_id, task, _ = committed_task(chain)
    assert task.profile == PROFILE and sorted(task.workers) == sorted([W1.peer_id, W2.peer_id])
    drawn = {v["verifier"] for slot in task.slots for v in slot["verifiers"]}
    assert DECOY.peer_id not in drawn and drawn
    assert chain.ledger.task_info(task_id)["profile"] == PROFILE
    other = submit(chain, profile=OTHER, workers=1, device="cuda")
    assert chain.ledger.state.tasks[other].status == TaskStatus.CREATED   # one node runs it, no verifier


def test_a_device_any_task_trains_on_its_profiles_device_class():
    chain = make_chain()
    for who in (ident(11), ident(12)):     # GPU nodes that also run the portable CPU profile
        chain.ok(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                        "hardware": {**hardware(), "gpu": "H100", "gpu_mem_mb": 81920}})
        chain.ok(who, "bond", {"amount": 9000})
    task = chain.ledger.state.tasks[submit(chain, device="any")]
    assert task.status == TaskStatus.ASSIGNED and task.device == "cpu"   # a CPU profile: CPU kernels for all
    assert chain.run(OWNER, "submit_task", {**FULL, "device": "cuda"}).code == TxCode.BAD_PAYLOAD


def test_assignment_waits_until_every_worker_could_be_audited():
    chain = make_chain(verifiers=0, workers=(W1,))
    task_id = submit(chain, workers=1)
    t = chain.ledger.state.tasks[task_id]
    assert t.status == TaskStatus.CREATED       # W1 would be the only node able to verify... itself
    register(chain, VERIFIERS[0], "verifier", 1000)
    assert t.status == TaskStatus.ASSIGNED and t.workers == [W1.peer_id]
    short = make_chain(verifiers=0, workers=(W1,), task_assign_s=2)
    waiting = short.ledger.state.tasks[submit(short, workers=1)]
    short.empty_blocks(2)
    assert waiting.status == TaskStatus.EXPIRED and "needs an eligible verifier besides itself" in waiting.reason
    off = make_chain(verifiers=0, workers=(W1,), audits_per_worker=0)
    assert off.ledger.state.tasks[submit(off, workers=1)].status == TaskStatus.ASSIGNED


# ---- drawing ---------------------------------------------------------------------------------

def test_slots_are_drawn_when_the_commit_phase_closes():
    chain = make_chain(audit_double_bps=10_000)
    task_id, task, result = committed_task(chain)
    assert task.status == TaskStatus.COMMITTED and len(task.slots) == 2 * 2
    assert [slot["slot"] for slot in task.slots] == [0, 1, 2, 3]
    assert len({slot["salt"] for slot in task.slots}) == 4 and all(len(slot["salt"]) == 32 for slot in task.slots)
    for slot in task.slots:
        assert 0 <= slot["segment"] < SEGMENTS and slot["outcome"] == "pending"
        names = [v["verifier"] for v in slot["verifiers"]]
        assert len(names) == 2 == len(set(names))                 # audit of the auditor: always, at 10000 bps
        assert OWNER.peer_id not in names and slot["worker"] not in names
        assert all(v["deadline"] == 1000 * (result.height + ANSWER_BLOCKS) for v in slot["verifiers"])   # block time
    events = [e for e in task_events(result) if e["event"] == "audit_assigned"]
    assert [e["slot"] for e in events] == [0, 1, 2, 3]
    assert events[0]["salt"] == task.slots[0]["salt"].hex()
    assert events[0]["deadline"] == 1000 * (result.height + ANSWER_BLOCKS)
    assert set(events[0]) >= {"task_id", "slot", "worker", "segment", "verifiers", "salt", "deadline"}
    single = make_chain()
    _, task, _ = committed_task(single)
    assert all(len(slot["verifiers"]) == 1 for slot in task.slots)


def test_the_draw_is_the_same_on_a_reloaded_replica():
    chain = make_chain(audit_double_bps=5000)
    task_id = submit(chain)
    commit(chain, W1, task_id)
    replica = Ledger(chain.genesis, LedgerState.load(chain.ledger.storage_items()))
    block_tx = chain.tx(W2, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                              "result_hash": b"\x22" * 32, "segments": SEGMENTS})
    first = chain.block([block_tx])
    from consensus.block import build_block
    led = replica
    block = build_block(CHAIN, led.height + 1, 1000 * (led.height + 1), led.last_block_hash, led.app_hash,
                        chain.proposer_identity, led.beacon, [block_tx.raw], ())
    assert replica.apply_block(block).app_hash == first.app_hash
    assert replica.state.tasks[task_id] == chain.ledger.state.tasks[task_id]
    reloaded = LedgerState.load(chain.ledger.storage_items())
    assert reloaded.tasks[task_id].slots == chain.ledger.state.tasks[task_id].slots


# ---- outcomes and payouts --------------------------------------------------------------------

def test_matching_answers_verify_and_pay_workers_and_verifiers():
    chain = make_chain()
    task_id, task, _ = committed_task(chain)
    receipt = chain.run(OWNER, "finalize", {"task_id": task_id})
    assert receipt.code == TxCode.BAD_STATE and "not resolved" in receipt.log
    answer_rest_honestly(chain, task_id, task)
    assert task.status == TaskStatus.VERIFIED and {s["outcome"] for s in task.slots} == {"ok"}
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert task.payouts[W1.peer_id] >= WORKER_SHARE and task.payouts[W2.peer_id] >= WORKER_SHARE
    expected: dict[str, int] = {}
    for slot in task.slots:
        expected[slot["verifiers"][0]["verifier"]] = expected.get(slot["verifiers"][0]["verifier"], 0) + POOL // 4
    for peer_id, amount in expected.items():
        worker_part = WORKER_SHARE if peer_id in task.workers else 0
        assert task.payouts[peer_id] == amount + worker_part
    assert sum(task.payouts.values()) == PRICE and task.escrow == 0


def test_an_undisputed_mismatch_slashes_the_worker_and_pays_its_innocent_co_worker():
    chain = make_chain(dispute_s=60)
    task_id, task, _ = committed_task(chain)
    cheat = slots_of(task, W2)
    for slot in cheat:
        v = slot["verifiers"][0]["verifier"]
        assert answer_slot(chain, task_id, slot["slot"], v, match=False, step=5).code == TxCode.OK
        assert slot["dispute_deadline"] > 0 and slot["verdict"]["match"] is False
    assert task.status == TaskStatus.DISPUTED
    answer_rest_honestly(chain, task_id, task)
    assert chain.run(OWNER, "finalize", {"task_id": task_id}).code == TxCode.BAD_STATE   # dispute window open
    chain.empty_blocks(60)
    assert {slot["outcome"] for slot in cheat} == {"guilty"}
    stake = chain.ledger.stake_info(W2.peer_id)["bonded"]
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, W2) == stake * 1000 // 10_000
    assert task.payouts.get(W2.peer_id, 0) < WORKER_SHARE and task.payouts[W1.peer_id] >= WORKER_SHARE
    assert chain.ledger.node_info(W2.peer_id)["reputation"] == -10
    assert all(slashed(chain, v) == 0 for v in VERIFIERS) and slashed(chain, W1) == 0
    assert task.result == b"\x22" * 32


def test_a_false_accusation_is_disputed_and_the_accuser_slashed():
    chain = make_chain()
    task_id, task, _ = committed_task(chain)
    slot = slots_of(task, W1)[0]
    accuser = slot["verifiers"][0]["verifier"]
    assert answer_slot(chain, task_id, slot["slot"], accuser, match=False, evidence=FAKE, step=2).code == TxCode.OK
    assert chain.run(W2, "dispute", {"task_id": task_id, "slot": slot["slot"]}).code == TxCode.UNAUTHORIZED
    disputed = chain.block([chain.tx(W1, "dispute", {"task_id": task_id, "slot": slot["slot"]})])
    assert disputed.receipts[0].code == TxCode.OK and slot["referees"] == []    # drawn from a later beacon
    result = run_scheduled_draws(chain, task_id)
    referees = [r["referee"] for r in slot["referees"]]
    assert len(referees) == 3 and not {OWNER.peer_id, W1.peer_id, accuser} & set(referees)
    [drawn] = [e for e in task_events(result) if e["event"] == "referees_drawn"]
    assert drawn["referees"] == referees and drawn["deadline"] == 1000 * (result.height + ANSWER_BLOCKS)
    assert any(e["event"] == "disputed" and e["slot"] == slot["slot"] for e in task_events(disputed))
    assert chain.run(W1, "dispute", {"task_id": task_id, "slot": slot["slot"]}).code == TxCode.ALREADY_KNOWN
    for referee in referees:
        assert vote(chain, task_id, slot["slot"], referee).code == TxCode.OK
    assert slot["outcome"] == "ok" and slot["verdict"] == {"match": True, "evidence": HONEST_EVIDENCE}
    answer_rest_honestly(chain, task_id, task)
    bonded = chain.ledger.stake_info(accuser)["bonded"]
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, accuser) == bonded * 1000 // 10_000
    assert task.payouts[W1.peer_id] >= WORKER_SHARE and slashed(chain, W1) == 0
    per_slot = POOL // 4
    for referee in referees:
        assert task.payouts.get(referee, 0) >= per_slot // 3
    honest = {v["verifier"] for s in task.slots for v in s["verifiers"]} - {accuser}
    assert all(slashed(chain, peer) == 0 for peer in honest | set(referees))


def test_a_rubber_stamp_is_caught_by_the_second_verifier():
    chain = make_chain(audit_double_bps=10_000)
    task_id, task, _ = committed_task(chain)
    slot = task.slots[0]
    honest, stamp = (v["verifier"] for v in slot["verifiers"])
    answer_slot(chain, task_id, slot["slot"], stamp, match=True, evidence=FAKE)   # said match, never replayed
    answer_slot(chain, task_id, slot["slot"], honest)
    assert len(slot["referees"]) == 3 and slot["dispute"] is None    # split verifiers: referees, no dispute
    for referee in (r["referee"] for r in slot["referees"]):
        vote(chain, task_id, slot["slot"], referee)
    assert slot["outcome"] == "ok"
    answer_rest_honestly(chain, task_id, task)
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, stamp) > 0 and slashed(chain, honest) == 0
    assert chain.ledger.node_info(stamp)["reputation"] == -10 + (stamp in task.workers)


def test_a_silent_slot_is_redrawn_to_the_bound_then_unaudited_and_unpaid():
    chain = make_chain(audit_redraws=2)
    task_id, task, _ = committed_task(chain)
    slot = task.slots[0]
    silent = slot["verifiers"][0]["verifier"]
    for other in task.slots[1:]:
        answer_slot(chain, task_id, other["slot"], other["verifiers"][0]["verifier"])
    redraws = []
    for _ in range(ANSWER_BLOCKS - 3):
        redraws += [e for e in task_events(chain.block()) if e["event"] == "audit_assigned"]
    assert len(slot["verifiers"]) == 2 and slot["verifiers"][1]["redraw"] is True
    assert redraws and redraws[0]["redraw"] is True and redraws[0]["verifiers"] == [slot["verifiers"][1]["verifier"]]
    late = answer_slot(chain, task_id, slot["slot"], silent)
    assert late.code == TxCode.BAD_STATE and "deadline" in late.log
    chain.empty_blocks(ANSWER_BLOCKS + 2)                   # the replacement is silent too: redrawn again
    assert slot["outcome"] == "pending" and len(slot["verifiers"]) == 3
    chain.empty_blocks(ANSWER_BLOCKS + 2)                   # ... and its replacement: the bound is reached
    assert slot["outcome"] == "unaudited" and len(slot["verifiers"]) == 3
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    worker = slot["worker"]
    verified_pay = sum(POOL // 3 for s in task.slots[1:] if s["verifiers"][0]["verifier"] == worker)
    assert task.payouts.get(worker, 0) - verified_pay == WORKER_SHARE // 2   # paid for its audited slot only
    for peer in (v["verifier"] for v in slot["verifiers"]):
        assert slashed(chain, peer) == 0


def test_a_split_referee_panel_draws_a_larger_one_then_leaves_the_slot_undecided_and_unpaid():
    chain = make_chain()
    task_id, task, _ = committed_task(chain)
    slot = slots_of(task, W2)[0]
    verifier = slot["verifiers"][0]["verifier"]
    answer_slot(chain, task_id, slot["slot"], verifier, match=False)
    dispute(chain, W2, task_id, slot["slot"])
    first = [r["referee"] for r in slot["referees"]]
    votes = [(True, HONEST_EVIDENCE), (False, HONEST_EVIDENCE), (False, FAKE)]
    for referee, (match, evidence) in zip(first, votes):
        vote(chain, task_id, slot["slot"], referee, match, evidence)
    assert slot["outcome"] == "pending" and len(slot["referees"]) == 6     # a second panel (pool: 3 left)
    second = [r["referee"] for r in slot["referees"][3:]]
    assert not set(second) & set(first) and {r["panel"] for r in slot["referees"][3:]} == {1}
    for referee, (match, evidence) in zip(second, [(True, FAKE), (False, b"\x01" * 32), (True, b"\x02" * 32)]):
        vote(chain, task_id, slot["slot"], referee, match, evidence)
    assert slot["outcome"] == "undecided" and slot["verdict"] is None       # nobody left for a third panel
    answer_rest_honestly(chain, task_id, task)
    chain.empty_blocks(3)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    decided = [s for s in task.slots if s["outcome"] in ("ok", "guilty")]   # the pool is split over these
    own_pool = sum(POOL // len(decided) for s in decided if s["verifiers"][0]["verifier"] == W2.peer_id)
    assert task.payouts.get(W2.peer_id, 0) - own_pool == WORKER_SHARE // 2   # never paid by default
    assert all(slashed(chain, peer) == 0 for peer in [verifier, *first, *second, W1.peer_id, W2.peer_id])


def test_one_vote_of_a_silent_panel_is_no_verdict_a_larger_panel_decides():
    chain = make_chain(referees=3)
    task_id, task, _ = committed_task(chain)
    slot = slots_of(task, W2)[0]
    answer_slot(chain, task_id, slot["slot"], slot["verifiers"][0]["verifier"], match=False)
    dispute(chain, W2, task_id, slot["slot"])
    first = slot["referees"][0]["referee"]
    vote(chain, task_id, slot["slot"], first, False)
    close_votes(chain, task_id)
    assert slot["outcome"] == "pending" and len(slot["referees"]) > 3      # one vote of three: a larger panel
    assert len(slot["referees"]) == 6                                       # the 3 left of the pool
    for entry in slot["referees"][3:]:                                       # 4 of 6: a majority
        vote(chain, task_id, slot["slot"], entry["referee"], False)
    close_votes(chain, task_id)
    assert slot["outcome"] == "guilty"
    late = vote(chain, task_id, slot["slot"], slot["referees"][1]["referee"])
    assert late.code == TxCode.BAD_STATE


def test_referees_on_the_losing_side_are_slashed_like_verifiers():
    chain = make_chain()
    task_id, task, _ = committed_task(chain)
    slot = slots_of(task, W1)[0]
    accuser = slot["verifiers"][0]["verifier"]
    answer_slot(chain, task_id, slot["slot"], accuser, match=False, evidence=FAKE, step=2)
    dispute(chain, W1, task_id, slot["slot"])
    honest, colluder = [r["referee"] for r in slot["referees"][:2]], slot["referees"][2]["referee"]
    for referee in honest:
        vote(chain, task_id, slot["slot"], referee)
    answer_rest_honestly(chain, task_id, task)                     # the other slots, before their deadlines
    vote(chain, task_id, slot["slot"], colluder, False, FAKE)     # sides with the false accuser, loses
    assert slot["outcome"] == "pending" and len(slot["referees"]) > 3   # a split panel grows (ADR 0210)
    for _ in range(chain.params.referee_rounds):
        for entry in [r for r in slot["referees"] if r["vote"] is None and r.get("commitment") is None]:
            vote(chain, task_id, slot["slot"], entry["referee"])
        if slot["outcome"] != "pending":
            break
        close_votes(chain, task_id)
    assert slot["outcome"] == "ok"
    bonded = chain.ledger.stake_info(colluder)["bonded"]
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert slashed(chain, colluder) == bonded * 1000 // 10_000
    assert chain.ledger.node_info(colluder)["reputation"] == -10 + (colluder in task.workers)
    assert all(slashed(chain, peer) == 0 for peer in honest) and slashed(chain, accuser) > 0


def test_who_may_send_what():
    chain = make_chain()
    task_id, task, _ = committed_task(chain)
    slot = task.slots[0]
    verifier = slot["verifiers"][0]["verifier"]
    outsider = next(v for v in VERIFIERS if v.peer_id != verifier)
    payload = {"task_id": task_id, "slot": 0, "match": True, "evidence": HONEST_EVIDENCE, "step": 0,
               "blinding": b"\x05" * 32}
    assert chain.run(outsider, "audit_result", payload).code == TxCode.UNAUTHORIZED
    assert chain.run(outsider, "audit_commit", {"task_id": task_id, "slot": 0, "commitment": b"\x06" * 32}).code \
        == TxCode.UNAUTHORIZED
    assert chain.run(identity_of(verifier), "audit_result", payload).code == TxCode.BAD_STATE   # commit first
    assert chain.run(identity_of(verifier), "audit_result", {**payload, "step": 3}).code == TxCode.BAD_PAYLOAD
    assert chain.run(identity_of(verifier), "audit_result", {**payload, "slot": 99}).code == TxCode.BAD_PAYLOAD
    assert chain.run(identity_of(verifier), "audit_result", {**payload, "task_id": b"\x00" * 32}).code \
        == TxCode.NOT_FOUND
    assert chain.run(identity_of(slot["worker"]), "dispute", {"task_id": task_id, "slot": 0}).code == TxCode.BAD_STATE
    assert answer_slot(chain, task_id, 0, verifier).code == TxCode.OK
    assert answer_slot(chain, task_id, 0, verifier).code == TxCode.BAD_STATE      # resolved ok
    assert vote(chain, task_id, 1, outsider.peer_id).code == TxCode.UNAUTHORIZED


def test_a_slot_without_any_eligible_verifier_is_unaudited_at_once():
    chain = make_chain(verifiers=1)
    task_id = submit(chain)
    commit(chain, W1, task_id)
    chain.ok(VERIFIERS[0], "unbond", {"amount": 1000})      # W1 and W2 can still verify each other
    chain.ok(W1, "unbond", {"amount": 3000})                # ... until W1 leaves: nobody can audit W2
    commit(chain, W2, task_id)
    run_scheduled_draws(chain, task_id)
    task = chain.ledger.state.tasks[task_id]
    assert {slot["outcome"] for slot in slots_of(task, W2)} == {"unaudited"}
    assert all(slot["verifiers"] == [] for slot in slots_of(task, W2))
    answer_rest_honestly(chain, task_id, task)
    chain.empty_blocks(2)
    chain.ok(OWNER, "finalize", {"task_id": task_id})
    assert task.payouts[W2.peer_id] == POOL and task.payouts[W1.peer_id] == WORKER_SHARE   # W2: its verifier pay only


# ---- the task document, records, genesis ---------------------------------------------------------

def test_the_task_document_shows_profile_segments_and_slots():
    chain = make_chain()
    task_id, task, _ = committed_task(chain)
    answer_slot(chain, task_id, 0, task.slots[0]["verifiers"][0]["verifier"], match=False, step=9)
    doc = chain.ledger.task_info(task_id)
    assert doc["profile"] == PROFILE and doc["segments"] == SEGMENTS
    slot = doc["slots"][0]
    assert set(slot) >= {"slot", "worker", "segment", "salt", "verifiers", "dispute", "referees", "outcome"}
    assert slot["salt"] == task.slots[0]["salt"].hex() and slot["dispute"] is None and slot["referees"] == []
    [entry] = slot["verifiers"]
    assert set(entry) >= {"verifier", "deadline", "answer"}
    assert entry["answer"] == {"match": False, "evidence": HONEST_EVIDENCE.hex(), "step": 9}
    assert doc["slots"][1]["verifiers"][0]["answer"] is None


def test_a_task_record_without_the_new_fields_keeps_its_bytes():
    t = Task(OWNER.peer_id, 1, {"model": "m"}, 5, 3)
    assert len(decode(t.encode())) == Task.V2_FIELDS
    assert Task.decode(encode(decode(t.encode()))) == t
    t.segments = 4
    assert len(decode(t.encode())) == Task.V3_FIELDS and Task.decode(t.encode()).segments == 4
    t.assign_deadline = 5_000                                 # ADR 0187: the whole record once it is set
    assert len(decode(t.encode())) == Task.V4_FIELDS and Task.decode(t.encode()) == t
    assert Task.decode(encode(decode(t.encode())[:Task.V3_FIELDS])).assign_deadline == 0
    t.epochs = {"current": 1, "commits": {}}                  # ADR 0203: up to epochs once it is set
    assert len(decode(t.encode())) == Task.V5_FIELDS and Task.decode(t.encode()) == t
    assert Task.decode(encode(decode(t.encode())[:Task.V4_FIELDS])).epochs == {}
    t.rate_reports = {OWNER.peer_id: {}}                      # ADR 0219: up to rate_reports once it is set
    assert len(decode(t.encode())) == Task.V6_FIELDS and Task.decode(t.encode()) == t
    assert Task.decode(encode(decode(t.encode())[:Task.V5_FIELDS])).rate_reports == {}
    t.relay_bytes = {OWNER.peer_id: {}}                       # ADR 0223: the whole record once it is set
    assert len(decode(t.encode())) == len(Task.FIELDS) and Task.decode(t.encode()) == t
    assert Task.decode(encode(decode(t.encode())[:Task.V6_FIELDS])).relay_bytes == {}
    old = Task.decode(encode(decode(Task(OWNER.peer_id, 1, {}, 5, 3).encode())[:Task.V1_FIELDS]))
    assert old.profile == "" and old.segments == 0 and old.slots == []


def test_audit_params_keep_old_genesis_hashes_and_are_validated():
    validators = (GenesisValidator(ident(0).peer_id, 10_000),)
    genesis = Genesis("c", 0, {}, validators, Params())
    obj = genesis.to_obj()
    for name in ("audits_per_worker", "audit_double_bps", "audit_answer_blocks", "dispute_blocks", "referees",
                 "serve_referee_s", "slash_false_audit_bps", "audit_redraws", "referee_rounds", "stake_cover_bps"):
        assert name not in hashed_params(Params())
        del obj["params"][name]
    assert Genesis.from_obj(obj).hash == genesis.hash
    assert Genesis("c", 0, {}, validators, Params(referees=5)).hash != genesis.hash
    defaults = Params()
    assert (defaults.audits_per_worker, defaults.audit_double_bps, defaults.referees) == (2, 5000, 3)
    for bad in ({"audit_double_bps": 10_001}, {"slash_false_audit_bps": 10_001}, {"referees": 0},
                {"audit_answer_s": 0}, {"dispute_s": 0}, {"audits_per_worker": 17}, {"referee_rounds": 0},
                {"referee_rounds": 5}, {"audit_redraws": 9}):
        with pytest.raises(GenesisError):
            Params(**bad).validate()

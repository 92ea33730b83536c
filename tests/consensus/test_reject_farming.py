"""Issue 22 item 7: one node farming reject_task (ADR 0192). A scripted attacker declares 10^6 Mbit/s
with the minimum bond and rejects every task it gets; before ADR 0192 it got all of one owner's tasks
and kept reject_fee from each, at no reputation cost."""
from test_ledger_kit import Chain, ident

from consensus.genesis import Params
from consensus.state import bandwidth, rejections
from consensus.state.records import NodeRecord, TaskStatus
from consensus.state.tasks import task_id_for, worker_weight
from consensus.txcodes import TxCode

OWNER, OTHER_OWNER, H1, H2, ATTACKER = (ident(i) for i in range(1, 6))
PRICE, REJECT_FEE = 100, 9
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
SPEC = {"model": "pt2", "dataset": "file", "workers": 1, "sync_mode": "allreduce", "codec": "int8",
        "profile": PROFILE, "segments": 1,
        "hyperparams": {"model_artifact": "ab" * 32, "dataset_artifact": "cd" * 32, "steps": 10}}


def hardware(mbps):
    return {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": mbps,
            "profiles": [PROFILE]}


def make_chain():
    # the test chain makes 1 s blocks: seconds = blocks; stake_cover_bps 0: bonds of 100-200 (ADR 0188)
    chain = Chain(params=Params(task_min_s=50, task_slack_s=0, audit_window_s=2, min_fee=0, task_assign_s=5,
                                reject_fee=REJECT_FEE, audits_per_worker=0, stake_cover_bps=0),
                  balances={ident(i).peer_id: 1_000_000 for i in range(1, 6)})
    for who, bond, mbps in ((H1, 200, 100), (H2, 200, 100), (ATTACKER, 100, 10**6)):
        chain.ok(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                        "hardware": hardware(mbps)})
        chain.ok(who, "bond", {"amount": bond})
    return chain


def submit(chain, owner):
    nonce = chain.ledger.nonce(owner.peer_id)
    receipt = chain.block([chain.tx(owner, "submit_task", {**SPEC, "price": PRICE})]).receipts[0]
    assert receipt.code == TxCode.OK, receipt
    return task_id_for(owner.peer_id, nonce)


def farm(chain, owner, tasks):
    """The attack: ``owner`` submits ``tasks`` tasks one block apart; the attacker rejects each task it
    is given at once, honest workers hold theirs. Returns the task ids."""
    ids = []
    for _ in range(tasks):
        ids.append(submit(chain, owner))
        for task_id in ids:
            task = chain.ledger.state.tasks[task_id]
            if ATTACKER.peer_id in task.workers and task.status == TaskStatus.ASSIGNED:
                receipt = chain.run(ATTACKER, "reject_task", {"task_id": task_id, "reason": "Untrainable"})
                assert receipt.code == TxCode.OK
    for _ in range(8):   # let the tasks nobody took expire
        chain.block([])
    return ids


def test_a_lone_rejecter_farming_one_owner_loses_and_the_owner_loses_nothing():
    chain = make_chain()
    start = {who.peer_id: chain.ledger.balance(who.peer_id) for who in (OWNER, ATTACKER)}
    ids = farm(chain, OWNER, 6)
    tasks = [chain.ledger.state.tasks[task_id] for task_id in ids]
    farmed = [task for task in tasks if ATTACKER.peer_id in task.workers]
    assert len(farmed) <= 1, f"the attacker got {len(farmed)} of {len(tasks)} tasks"
    assert chain.ledger.balance(ATTACKER.peer_id) <= start[ATTACKER.peer_id]
    assert chain.ledger.node_info(ATTACKER.peer_id)["reputation"] < 0
    # the owner paid only for the tasks honest workers hold: every rejected or expired task came back whole
    held = sum(task.escrow for task in tasks if task.status in TaskStatus.ACTIVE)
    assert chain.ledger.balance(OWNER.peer_id) + held == start[OWNER.peer_id]
    assert all(task.payouts.get(OWNER.peer_id) == PRICE for task in tasks if task.status in TaskStatus.FINAL)


def test_declared_bandwidth_above_the_cap_buys_no_rank():
    chain = make_chain()
    state = chain.ledger.state
    cap = bandwidth.UNVERIFIED_BANDWIDTH_CAP_MBPS
    assert bandwidth.ranking_bandwidth(state.nodes[ATTACKER.peer_id]) == cap
    # half the bond, half the weight: 10^6 declared Mbit/s count as much as 100
    assert worker_weight(state, ATTACKER.peer_id) * 2 == worker_weight(state, H1.peer_id)
    assert bandwidth.ranking_bandwidth(NodeRecord([], [], [], {"bandwidth_mbps": 10})) == 10
    assert bandwidth.ranking_bandwidth(NodeRecord([], [], [], {})) == 0


def test_repeated_lone_rejections_bar_the_node_from_every_owner_for_the_cooldown():
    chain = make_chain()
    for who in (H1, H2):                       # the honest workers leave: only the attacker is there
        chain.ok(who, "unbond", {"amount": 200})
    owners = [ident(i) for i in range(6, 6 + rejections.MAX_LONE_REJECTIONS + 1)]
    for owner in owners:
        chain.ok(ident(1), "transfer", {"to": owner.peer_id, "amount": 10_000})
    given = []
    for owner in owners:
        ids = farm(chain, owner, 2)
        given.append(sum(ATTACKER.peer_id in chain.ledger.state.tasks[t].workers for t in ids))
    # one task per owner (then barred from that owner) until MAX_LONE_REJECTIONS, then none at all
    assert given == [1] * rejections.MAX_LONE_REJECTIONS + [0]
    height = chain.ledger.state.height
    bars = rejections.recent_bars(chain.ledger.state, height + rejections.REJECT_COOLDOWN_BLOCKS + 10)
    assert bars.allowed(OWNER.peer_id, [ATTACKER.peer_id]) == [ATTACKER.peer_id]   # the cooldown ends


def test_a_rejecter_outvoted_by_a_crew_that_is_paid_is_charged_like_a_lone_rejecter():
    """Item 3 of the hardening leftovers (ADR 0197): the attacker sits in a 3-worker crew, rejects, the
    two honest workers commit and are paid. Before, the rejecter was only a no-show (-5) and was given
    the same owner's next task at once; now its rejection counts as a lone one: barred from that owner."""
    from consensus.state.tasks import REPUTATION_NO_SHOW

    chain = Chain(params=Params(task_min_s=50, task_slack_s=0, audit_window_s=2, min_fee=0, task_assign_s=5,
                                reject_fee=REJECT_FEE, audits_per_worker=0, stake_cover_bps=0),
                  balances={ident(i).peer_id: 1_000_000 for i in range(1, 7)})
    spare = ident(6)
    for who, bond in ((H1, 3000), (H2, 3000), (ATTACKER, 3000), (spare, 500)):
        chain.ok(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                        "hardware": hardware(100)})
        chain.ok(who, "bond", {"amount": bond})
    crew = {"workers": 3, "price": PRICE}

    def submit_crew():
        nonce = chain.ledger.nonce(OWNER.peer_id)
        assert chain.run(OWNER, "submit_task", {**SPEC, **crew}).code == TxCode.OK
        task_id = task_id_for(OWNER.peer_id, nonce)
        return task_id, chain.ledger.state.tasks[task_id]

    task_id, first = submit_crew()
    assert sorted(first.workers) == sorted(p.peer_id for p in (H1, H2, ATTACKER))
    assert chain.run(ATTACKER, "reject_task", {"task_id": task_id, "reason": "Untrainable"}).code == TxCode.OK
    for who in (H1, H2):
        assert chain.run(who, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                                "result_hash": b"\x22" * 32, "segments": 1}).code == TxCode.OK
    chain.empty_blocks(3)
    chain.ok(OTHER_OWNER, "finalize", {"task_id": task_id})
    assert first.status == TaskStatus.PAID and ATTACKER.peer_id not in first.payouts
    reputation = chain.ledger.node_info(ATTACKER.peer_id)["reputation"]
    assert reputation == REPUTATION_NO_SHOW == rejections.REPUTATION_LONE_REJECTION
    _, second = submit_crew()
    assert second.status == TaskStatus.ASSIGNED
    assert ATTACKER.peer_id not in second.workers, "the outvoted rejecter got the same owner's next task"
    assert spare.peer_id in second.workers
    assert rejections.outvoted_rejecters(first) == [ATTACKER.peer_id]
    bars = rejections.recent_bars(chain.ledger.state, chain.ledger.state.height)
    assert bars.allowed(OTHER_OWNER.peer_id, [ATTACKER.peer_id]) == [ATTACKER.peer_id]   # other owners: as before

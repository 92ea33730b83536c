"""Bandwidth verified by co-workers (ADR 0219, issue 22 item 4): commit_result's ``peer_rates`` name only
co-workers; the reports of a task that ends paid become measurements on the co-workers' node records;
ranking counts a claim above the unverified cap only as far as the median of at least three reporters
confirms it. A liar declaring 10^6 Mbit/s with a sybil co-worker vouching for it gains no rank; honest
nodes whose co-workers measured 400 Mbit/s rank above the cap; records without reports keep their
bytes (and the app hash its value)."""
import pytest
from test_ledger_kit import Chain, ident

from consensus.genesis import Params
from consensus.state import bandwidth
from consensus.state.records import NodeRecord, Task, TaskStatus
from consensus.state.tasks import task_id_for, worker_weight
from consensus.txcodes import TxCode, TxError

OWNER, OUTSIDER = ident(1), ident(2)
LIAR, SYBIL, H1, H2, H3 = (ident(i) for i in range(3, 8))
CREW = (LIAR, SYBIL, H1, H2, H3)
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
PRICE = 10_000


def hardware(mbps):
    return {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": mbps,
            "profiles": [PROFILE]}


def make_chain(declared: dict) -> Chain:
    chain = Chain(params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2, min_fee=0, audits_per_worker=0,
                                stake_cover_bps=0),
                  balances={ident(i).peer_id: 1_000_000 for i in range(1, 9)})
    for who in CREW:
        chain.ok(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                        "hardware": hardware(declared.get(who, 1000))})
        chain.ok(who, "bond", {"amount": 1000})
    return chain


def submit(chain) -> bytes:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 10},
                                    "workers": len(CREW), "sync_mode": "allreduce", "codec": "int8",
                                    "profile": PROFILE, "segments": 1, "price": PRICE})
    task_id = task_id_for(OWNER.peer_id, nonce)
    assert chain.ledger.state.tasks[task_id].status == TaskStatus.ASSIGNED
    return task_id


def commit(chain, who, task_id, rates):
    payload = {"task_id": task_id, "segments_root": b"\x11" * 32, "result_hash": b"\x22" * 32, "segments": 1}
    return chain.run(who, "commit_result", {**payload, "peer_rates": rates} if rates is not None else payload)


def run_task(chain, reports) -> bytes:
    """One task for the whole crew; each worker commits with ``reports(worker)`` and the task is settled."""
    task_id = submit(chain)
    for who in CREW:
        assert commit(chain, who, task_id, reports(who)).code == TxCode.OK
    chain.empty_blocks(chain.params.audit_window_s + 1)
    chain.ok(OUTSIDER, "finalize", {"task_id": task_id})
    assert chain.ledger.state.tasks[task_id].status == TaskStatus.PAID
    return task_id


def others(who, mbps=None, **special):
    """``who``'s report: every co-worker at ``mbps``, except the ones named in ``special``."""
    return {w.peer_id: special.get(w.peer_id, mbps) for w in CREW if w is not who}


def test_peer_rates_name_only_co_workers():
    chain = make_chain({})
    task_id = submit(chain)
    assert commit(chain, H1, task_id, {H1.peer_id: 500}).code == TxCode.BAD_PAYLOAD          # itself
    assert commit(chain, H1, task_id, {OUTSIDER.peer_id: 500}).code == TxCode.BAD_PAYLOAD    # not in the crew
    for bad in ({"not-a-peer": 500}, {H2.peer_id: 10**6 + 1}, {H2.peer_id: -1}):   # the decoder refuses these
        with pytest.raises(TxError, match="peer_rates"):
            chain.tx(H1, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                           "result_hash": b"\x22" * 32, "segments": 1, "peer_rates": bad}, nonce=0)
    assert commit(chain, H1, task_id, {H2.peer_id: 400}).code == TxCode.OK
    assert chain.ledger.state.tasks[task_id].rate_reports == {H1.peer_id: {H2.peer_id: 400}}
    assert all(not chain.ledger.state.nodes[w.peer_id].measured for w in CREW)   # nothing before it is paid


def test_co_workers_measurements_lift_an_honest_node_above_the_cap():
    chain = make_chain({})
    state = chain.ledger.state
    before = worker_weight(state, H1.peer_id)
    assert bandwidth.ranking_bandwidth(state.nodes[H1.peer_id]) == bandwidth.UNVERIFIED_BANDWIDTH_CAP_MBPS
    run_task(chain, lambda who: others(who, 400))
    node = state.nodes[H1.peer_id]
    assert sorted(reporter for reporter, _, _ in node.measured) == sorted(w.peer_id for w in CREW if w is not H1)
    assert bandwidth.verified_mbps(node) == 400 and bandwidth.ranking_bandwidth(node) == 400
    assert worker_weight(state, H1.peer_id) > before    # 400 Mbit/s: class 10 (was 8 at the 100 cap)
    assert chain.ledger.node_info(H1.peer_id)["measured"][0][1] == 400   # the record shows them
    run_task(chain, lambda who: others(who, 300))       # a reporter's newer figure replaces its older one
    assert len(node.measured) == len(CREW) - 1 and bandwidth.verified_mbps(node) == 300


def test_a_liar_vouched_for_by_its_sybil_gains_no_rank_and_cannot_sink_honest_nodes_below_the_cap():
    chain = make_chain({LIAR: 10**6, SYBIL: 10**6})
    state = chain.ledger.state
    liar_before = worker_weight(state, LIAR.peer_id)

    def reports(who):
        if who is SYBIL:     # vouches for the liar, slanders the honest
            return others(who, 1, **{LIAR.peer_id: 10**6})
        if who is LIAR:
            return others(who, 1, **{SYBIL.peer_id: 10**6})
        return others(who, 400, **{LIAR.peer_id: 50, SYBIL.peer_id: 50})   # what honest co-workers measured

    for _ in range(3):
        run_task(chain, reports)
    assert bandwidth.verified_mbps(state.nodes[LIAR.peer_id]) == 50
    assert bandwidth.ranking_bandwidth(state.nodes[LIAR.peer_id]) == bandwidth.UNVERIFIED_BANDWIDTH_CAP_MBPS
    reputation = state.nodes[LIAR.peer_id].reputation
    assert worker_weight(state, LIAR.peer_id) == liar_before * (100 + reputation) // 100   # class 8: the cap's
    for honest in (H1, H2, H3):   # two slanders among four reporters: the median is an honest figure
        assert bandwidth.ranking_bandwidth(state.nodes[honest.peer_id]) >= bandwidth.UNVERIFIED_BANDWIDTH_CAP_MBPS


def test_only_paid_reporters_about_paid_co_workers_count_and_two_reporters_are_not_enough():
    node = NodeRecord(["compute"], [], [], hardware(1000))
    task = Task(OWNER.peer_id, 1, {"workers": 3}, PRICE, 1)
    task.workers = sorted([H1.peer_id, H2.peer_id, H3.peer_id])
    task.rate_reports = {H1.peer_id: {H3.peer_id: 900}, H2.peer_id: {H3.peer_id: 900}}

    class State:   # the two things record_paid_task touches
        nodes = {H3.peer_id: node}
        touched: list = []

        def touch(self, table, key):
            self.touched.append(key)

    bandwidth.record_paid_task(State(), task, [H1.peer_id, H3.peer_id], 10)   # H2 was not paid
    assert node.measured == [[H1.peer_id, 900, 10]]
    bandwidth.record_paid_task(State(), task, [H1.peer_id, H2.peer_id], 11)   # H3 was not paid
    assert node.measured == [[H1.peer_id, 900, 10]]
    bandwidth.record_paid_task(State(), task, [H1.peer_id, H2.peer_id, H3.peer_id], 12)
    assert len(node.measured) == 2 and bandwidth.verified_mbps(node) is None   # two reporters: unverified
    assert bandwidth.ranking_bandwidth(node) == bandwidth.UNVERIFIED_BANDWIDTH_CAP_MBPS


def test_records_without_reports_keep_their_encoding():
    node = NodeRecord(["compute"], ["/ip4/1.2.3.4/tcp/1"], [], hardware(100), 3, 7, 1)
    assert len(node.to_obj()) == 7 and NodeRecord.decode(node.encode()).measured == []
    node.measured = [[H1.peer_id, 400, 9]]
    assert NodeRecord.decode(node.encode()).measured == [[H1.peer_id, 400, 9]]
    task = Task(OWNER.peer_id, 1, {"workers": 1}, PRICE, 1)
    task.epochs = {"current": 0}
    assert len(task.to_obj()) == Task.V5_FIELDS
    task.rate_reports = {H1.peer_id: {H2.peer_id: 5}}
    assert Task.decode(task.encode()).rate_reports == {H1.peer_id: {H2.peer_id: 5}}

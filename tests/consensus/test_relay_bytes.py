"""Relay bytes per task on the ledger (ADR 0223, issue 25 item 4): the task keeps each committer's
``relay_bytes`` for registered relays (other entries dropped, the commit stands; malformed ones refused
by the decoder), dkb_getTask shows it and the TaskInfo sums it per relay; a task record without reports
keeps its old encoding (and app hash)."""
import pytest
from test_ledger_kit import Chain, ident

from consensus.encoding import decode, encode
from consensus.genesis import Params
from consensus.state.ledger import task_json
from consensus.state.records import Task, TaskStatus
from consensus.state.relay_bytes import by_relay
from consensus.state.tasks import task_id_for
from consensus.task_info import TaskInfo
from consensus.txcodes import TxCode, TxError

OWNER, RELAY1, RELAY2, NOT_RELAY = ident(1), ident(2), ident(3), ident(4)
CREW = (ident(5), ident(6), ident(7))
PROFILE = "cpu-x86-64-avx2/torch-2.13.0"
HARDWARE = {"cpu_cores": 4, "ram_mb": 8000, "gpu": "", "gpu_mem_mb": 0, "bandwidth_mbps": 100,
            "profiles": [PROFILE]}


def make_chain() -> Chain:
    chain = Chain(params=Params(task_min_s=12, task_slack_s=0, audit_window_s=2, min_fee=0, audits_per_worker=0,
                                stake_cover_bps=0),
                  balances={ident(i).peer_id: 1_000_000 for i in range(1, 9)})
    for who in CREW:
        chain.ok(who, "register_node", {"roles": ["compute"], "listen_addrs": [], "relay_addrs": [],
                                        "hardware": HARDWARE})
        chain.ok(who, "bond", {"amount": 1000})
    for who, roles in ((RELAY1, ["relay"]), (RELAY2, ["relay", "validator"]), (NOT_RELAY, ["validator"])):
        chain.ok(who, "register_node", {"roles": roles, "listen_addrs": [], "relay_addrs": [], "hardware": HARDWARE})
    return chain


def submit(chain) -> bytes:
    nonce = chain.ledger.nonce(OWNER.peer_id)
    chain.ok(OWNER, "submit_task", {"model": "mlp-digits", "dataset": "digits", "hyperparams": {"steps": 10},
                                    "workers": len(CREW), "sync_mode": "allreduce", "codec": "int8",
                                    "profile": PROFILE, "segments": 1, "price": 10_000})
    task_id = task_id_for(OWNER.peer_id, nonce)
    assert chain.ledger.state.tasks[task_id].status == TaskStatus.ASSIGNED
    return task_id


def commit(chain, who, task_id, relayed):
    payload = {"task_id": task_id, "segments_root": b"\x11" * 32, "result_hash": b"\x22" * 32, "segments": 1}
    return chain.run(who, "commit_result", {**payload, "relay_bytes": relayed} if relayed is not None else payload)


def test_reports_name_registered_relays_and_add_up_per_relay():
    chain = make_chain()
    task_id = submit(chain)
    a, b, c = CREW
    for bad in ({"not-a-peer": 5}, {RELAY1.peer_id: -1}, {RELAY1.peer_id: 2**53 + 1},
                {ident(100 + i).peer_id: 1 for i in range(17)}):   # the decoder refuses these
        with pytest.raises(TxError, match="relay_bytes"):
            chain.tx(a, "commit_result", {"task_id": task_id, "segments_root": b"\x11" * 32,
                                          "result_hash": b"\x22" * 32, "segments": 1, "relay_bytes": bad}, nonce=0)
    # entries naming no registered relay (a validator, an unregistered peer, the sender) are dropped;
    # the commit stands (the figure is informational, the commit is what the worker is paid for)
    assert commit(chain, a, task_id, {RELAY1.peer_id: 4_000_000, RELAY2.peer_id: 480_000, NOT_RELAY.peer_id: 9,
                                      OWNER.peer_id: 9, a.peer_id: 9}).code == TxCode.OK
    assert commit(chain, b, task_id, {RELAY1.peer_id: 1_000, NOT_RELAY.peer_id: 7}).code == TxCode.OK
    assert commit(chain, c, task_id, None).code == TxCode.OK                                 # all direct: no report
    task = chain.ledger.state.tasks[task_id]
    assert task.relay_bytes == {a.peer_id: {RELAY1.peer_id: 4_000_000, RELAY2.peer_id: 480_000},
                                b.peer_id: {RELAY1.peer_id: 1_000}}
    assert by_relay(task.relay_bytes) == {RELAY1.peer_id: 4_001_000, RELAY2.peer_id: 480_000}

    doc = task_json(task_id, task, 0)                                  # what dkb_getTask answers
    info = TaskInfo.from_json(doc)
    assert info.relay_bytes == task.relay_bytes
    assert info.relayed_by_relay == {RELAY1.peer_id: 4_001_000, RELAY2.peer_id: 480_000}
    assert Task.decode(task.encode()).relay_bytes == task.relay_bytes


def test_a_task_without_reports_keeps_its_encoding():
    task = Task(OWNER.peer_id, 0, {}, 10, 1)
    task.rate_reports = {OWNER.peer_id: {}}
    assert len(decode(task.encode())) == Task.V6_FIELDS                # no relay_bytes field written
    assert Task.decode(task.encode()).relay_bytes == {}
    task.relay_bytes = {OWNER.peer_id: {RELAY1.peer_id: 7}}
    assert len(decode(task.encode())) == Task.V6_FIELDS + 1
    assert Task.decode(encode(decode(task.encode())[:Task.V6_FIELDS])).relay_bytes == {}

"""The compute role's worker side of per-worker commitments: a task whose declared segment count
differs from its spec's is rejected; committed records are served with Merkle proofs over
/dekube/task-segments/2 from the results file, also after a restart."""
import asyncio

from consensus.task_info import TaskInfo
from ml.compute.segment_record import SegmentRecord, StepHashes, leaves, root
from ml.compute.segments_protocol import check_answer
from node.identity import Identity
from node.runtime import Node
from tests.compute.test_worker_flow import make_role, task_doc
from tests.node.node_harness import local_config

KEY = "22" * 32


def test_a_task_declaring_another_segment_count_is_rejected(tmp_path):
    role = make_role(tmp_path)
    task = task_doc(role, segments=3)   # the spec has 4 steps in segments of 10: one segment
    asyncio.run(role.training.run_job(TaskInfo.from_json(task)))
    [(tx, payload)] = role.ledger.sent
    assert tx == "reject_task" and "declares 3 segments, its spec has 1" in payload["reason"]


def _records(count):
    return [SegmentRecord(i, f"{i:02x}" * 32, "aa" * 32, "bb" * 32, (StepHashes("cc" * 32, "dd" * 32, "ee" * 32),),
                          "ff" * 32) for i in range(count)]


def test_records_are_served_with_proofs_after_a_restart(tmp_path):
    identity = Identity.generate()
    node = Node(local_config(), identity, ["compute"], data_dir=tmp_path)
    role = node.role("compute")
    records = _records(5)
    task_id = bytes.fromhex(KEY)
    committed = root(leaves(task_id, node.peer_id, records))
    role.store.save(KEY, {"records": [r.to_obj() for r in records], "leaf_worker": node.peer_id,
                      "segments_root": committed.hex(), "params_hash": "00" * 32, "weights": "11" * 32})
    restarted = Node(local_config(), identity, ["compute"], data_dir=tmp_path).role("compute")
    for index in range(5):
        answer = restarted.store.record_for(task_id, index, 5)
        assert answer.record == records[index]
        check_answer(answer, task_id, node.peer_id, committed, 5)
    assert restarted.store.record_for(task_id, 5, 6) is None and restarted.store.record_for(bytes(32), 0, 1) is None


def test_records_are_proved_under_an_epochs_commitment_while_later_ones_are_kept(tmp_path):
    """An epoch's audit asks for a record under the progress commitment of that epoch (docs/adr/0230): the
    worker proves it under the root of its records up to there, though it already holds later ones."""
    identity = Identity.generate()
    role = Node(local_config(), identity, ["compute"], data_dir=tmp_path).role("compute")
    records, task_id = _records(6), bytes.fromhex(KEY)
    epoch_root = root(leaves(task_id, role.node.peer_id, records[:2]))
    role.store.save(KEY, {"records": [r.to_obj() for r in records[:2]], "leaf_worker": role.node.peer_id})
    assert role.store.record_for(task_id, 1, 2) is not None   # the leaves are cached from here on
    role.store.save(KEY, {"records": [r.to_obj() for r in records], "leaf_worker": role.node.peer_id})
    answer = role.store.record_for(task_id, 1, 2)
    check_answer(answer, task_id, role.node.peer_id, epoch_root, 2)
    full = role.store.record_for(task_id, 1, 6)   # the same record under the result's root
    check_answer(full, task_id, role.node.peer_id, root(leaves(task_id, role.node.peer_id, records)), 6)
    assert role.store.record_for(task_id, 2, 2) is None and role.store.record_for(task_id, 1, 7) is None


def test_copycat_takes_another_workers_committed_records(tmp_path, monkeypatch):
    from ml.compute import segments_protocol
    from ml.compute.segment_record import proof

    role = make_role(tmp_path)
    task_id = bytes.fromhex(KEY)
    victim = "12D3KooWvictim"
    records = _records(3)
    victim_leaves = leaves(task_id, victim, records)
    fetched = []

    async def fake_fetch(host, peer, tid, index, segments):
        fetched.append((peer, index))
        return segments_protocol.SegmentAnswer(records[index], proof(victim_leaves, index), 3)

    base_call = role.ledger.call

    async def call(method, *params):
        if method == "dkb_getTask":
            return {"commits": {victim: [root(victim_leaves).hex(), "11" * 32, 3, 9]}}
        return await base_call(method, *params)

    monkeypatch.setattr(segments_protocol, "fetch_record", fake_fetch)
    monkeypatch.setattr(role.ledger, "call", call)
    role.faults.mode = "copycat"   # the seam tests and devtools set through [compute] fault_inject
    copied, leaf_worker = asyncio.run(role.faults.committed_records(task_id, role.node.peer_id, []))
    assert copied == records and leaf_worker == victim and fetched == [(victim, 0), (victim, 1), (victim, 2)]
    # its commitment is the victim's root, which no record proves under the copycat's own id
    assert root(leaves(task_id, leaf_worker, copied)) == root(victim_leaves)
    assert root(leaves(task_id, role.node.peer_id, copied)) != root(victim_leaves)


def test_fault_inject_accepts_the_adversary_modes_only():
    import pytest

    for mode in ("", "lazy", "partial:0.1", "partial:1", "poison_zero", "poison_noise", "poison_stealth", "copycat",
                 "wrong_segments",
                 "false_accuser", "rubber_stamp"):
        assert local_config({("compute", "fault_inject"): mode})["compute"]["fault_inject"] == mode
    for mode in ("partial:1.5", "partial:", "lazzy"):
        with pytest.raises(Exception, match="fault_inject|partial"):
            local_config({("compute", "fault_inject"): mode})

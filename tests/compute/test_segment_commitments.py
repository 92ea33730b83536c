"""Per-worker segment commitments (docs/adr/0167): records, Merkle proofs, one-segment replay that
names a deviating worker alone, adversary modes, hostile input, and /dekube/task-segments/2."""
import asyncio
import dataclasses
import hashlib
import json
import struct

import pytest
import torch

from consensus.task_info import TaskDocError, TaskInfo
from ml.compute import segments_protocol
from ml.compute.commitment import Commitment
from ml.compute.segment_record import (
    MAX_STEPS,
    BadRecord,
    SegmentRecord,
    StepHashes,
    leaf,
    leaves,
    proof,
    root,
    verify_proof,
)
from ml.compute.segment_replay import replay_segment_blobs
from ml.compute.task_spec import InvalidTask, check_segments, submit_payload
from ml.train.faults import BadFault, Fault, falsify_records
from ml.train.segments import averages_bytes, load_averages
from ml.train.simulation import build_recorded, run_trainers
from ml.train.spec import TrainSpec
from ml.train.state_file import BadStateFile, load_state, state_bytes
from node.identity import Identity
from node.p2p.host import Host

WORLD = 3
TASK = bytes(range(32))
SALT = b"\x01" * 32
DP = TrainSpec(steps=30, segment_steps=10, seed=2)


def train(spec, faults=None):
    trainers, sink = build_recorded(spec, WORLD, faults)
    asyncio.run(run_trainers(trainers))
    return [t.recorder.records for t in trainers], sink


def replay(spec, rank, record, sink, salt=SALT, until_step=None):
    return replay_segment_blobs(spec, rank, WORLD, record, sink.blobs, None, salt, until_step)


@pytest.fixture(scope="module")
def honest_dp():
    return train(DP)


def test_segment_count_follows_the_spec():
    assert DP.segment_count == 3 and TrainSpec(steps=31, segment_steps=10).segment_count == 4
    assert TrainSpec(steps=31, segment_steps=10).steps_in_segment(3) == 1
    assert TrainSpec(mode="diloco", steps=40, inner_steps=10).segment_count == 4
    assert submit_payload(DP, workers=3, price=5)["segments"] == 3
    check_segments(TaskInfo.from_json({"spec": {"segments": 3}}), DP)
    check_segments(TaskInfo.from_json({"spec": {}}), DP)   # a task from before segment counts
    check_segments(TaskInfo.from_json({"segments": 0, "spec": {}}), DP)   # the ledger's 0: none declared
    check_segments(TaskInfo.from_json({"segments": 3, "spec": {}}), DP)
    for bad in (2, 4):
        with pytest.raises(InvalidTask):
            check_segments(TaskInfo.from_json({"segments": bad, "spec": {}}), DP)
    with pytest.raises(InvalidTask):
        check_segments(TaskInfo.from_json({"spec": {"segments": 0}}), DP)
    for bad in (True, "3"):   # not a count at all: the decoder refuses the task
        with pytest.raises(TaskDocError):
            TaskInfo.from_json({"segments": bad, "spec": {}})


def test_honest_data_parallel_segments_all_replay(honest_dp):
    records, sink = honest_dp
    assert [len(r) for r in records] == [3, 3, 3]
    for rank in range(WORLD):
        for record in records[rank]:
            got = replay(DP, rank, record, sink)
            assert got.match and got.first_divergence is None and len(got.evidence) == 32
    # every worker's averages file is the same artifact (a verifier fetches it from any of them)
    assert all(len({r[k].averages for r in records}) == 1 for k in range(3))
    # the state chain: each segment starts where the previous one ended
    assert all(a.state_out == b.state_in for a, b in zip(records[0], records[0][1:]))


def test_evidence_depends_on_salt_and_on_the_computation(honest_dp):
    records, sink = honest_dp
    first = replay(DP, 1, records[1][1], sink)
    assert replay(DP, 1, records[1][1], sink).evidence == first.evidence
    assert replay(DP, 1, records[1][1], sink, salt=b"\x02" * 32).evidence != first.evidence
    assert replay(DP, 2, records[2][1], sink).evidence != first.evidence   # another shard
    partial = replay(DP, 1, records[1][1], sink, until_step=3)
    assert partial.match and partial.evidence != first.evidence
    assert replay(DP, 1, records[1][1], sink, until_step=3).evidence == partial.evidence
    with pytest.raises(ValueError):
        replay(DP, 1, records[1][1], sink, until_step=10)


@pytest.mark.parametrize("mode", ["poison_zero", "poison_noise"])
def test_a_poisoner_is_named_alone(mode):
    records, sink = train(DP, {1: mode})
    for rank in range(WORLD):
        for record in records[rank]:
            got = replay(DP, rank, record, sink)
            if rank == 1:
                assert got.first_divergence == (0, "gradient")
            else:
                assert got.match, (rank, record.index, got)


def test_lazy_worker_diverges_at_its_first_skipped_step():
    records, sink = train(DP, {0: "lazy"})
    assert all(replay(DP, 0, r, sink).first_divergence == (1, "gradient") for r in records[0])
    assert all(replay(DP, 2, r, sink).match for r in records[2])


def test_partial_cheater_fakes_only_some_segments():
    spec = TrainSpec(steps=60, segment_steps=10, seed=2)
    records, sink = train(spec, {2: "partial:0.5"})
    fault = Fault("partial:0.5", seed=0)
    faked = [fault.fake_segment(i) for i in range(spec.segment_count)]
    assert any(faked) and not all(faked)
    for record, fake in zip(records[2], faked):
        got = replay(spec, 2, record, sink)
        assert got.match != fake and (got.first_divergence == (0, "gradient")) == fake


def test_wrong_segments_are_caught():
    records, sink = train(DP)
    falsified = falsify_records(records[0])
    assert replay(DP, 0, falsified[1], sink).first_divergence == (0, "gradient")


@pytest.mark.parametrize("spec", [
    TrainSpec(steps=20, segment_steps=10, seed=3, codec="topk", codec_options={"ratio": 0.05}),
    TrainSpec(steps=20, segment_steps=10, seed=3, codec="sign"),
    TrainSpec(steps=20, segment_steps=10, seed=3, codec="powersgd2"),
    TrainSpec(steps=20, segment_steps=10, seed=3, codec="int8"),
    TrainSpec(mode="diloco", steps=40, inner_steps=10, warmup_steps=10, seed=3),
    TrainSpec(mode="diloco", steps=30, inner_steps=10, seed=3, codec="topk", codec_options={"ratio": 0.1}),
], ids=["topk-ef", "sign-ef", "powersgd", "int8", "diloco-warm", "diloco-topk"])
def test_honest_replay_from_a_checkpoint_for_every_codec_and_mode(spec):
    records, sink = train(spec, {0: "poison_zero"})
    for rank in range(WORLD):
        for record in records[rank]:
            assert replay(spec, rank, record, sink).match == (rank != 0), (rank, record.index)


def test_error_feedback_residual_is_in_the_checkpoint():
    spec = TrainSpec(steps=20, segment_steps=10, seed=3, codec="sign")
    records, sink = train(spec)
    state = load_state(sink.blobs[records[1][1].checkpoint])
    assert state["averager"]["residual"].abs().sum() > 0


def test_tampered_averages_or_checkpoint_are_a_mismatch(honest_dp):
    records, sink = honest_dp
    record = records[0][1]
    rounds = load_averages(sink.blobs[record.averages])
    rounds[12][0][0].view(-1)[0] += 1.0
    forged = averages_bytes([(r, ts, parts) for r, (ts, parts) in sorted(rounds.items())])
    blobs = dict(sink.blobs)
    blobs[record.averages] = forged   # the artifact id no longer matches
    assert replay_segment_blobs(DP, 0, WORLD, record, blobs, None, SALT).first_divergence == (0, "average")
    from node.artifacts.merkle import artifact_id_of_bytes
    relabelled = dataclasses.replace(record, averages=artifact_id_of_bytes(forged))
    blobs[relabelled.averages] = forged   # consistent id, but the step-2 average is not what the record says
    assert replay_segment_blobs(DP, 0, WORLD, relabelled, blobs, None, SALT).first_divergence == (2, "average")
    assert replay_segment_blobs(DP, 0, WORLD, record, {}, None, SALT).first_divergence == (0, "state_in")
    short = dataclasses.replace(record, steps=record.steps[:-1])
    assert replay(DP, 0, short, sink).first_divergence == (0, "record")


def _record(index=0, steps=2):
    h = "ab" * 32
    return SegmentRecord(index, h, h, h, tuple(StepHashes(h, h, h) for _ in range(steps)), h)


def test_records_round_trip_and_reject_hostile_input():
    record = _record(3)
    assert SegmentRecord.from_json(record.canonical()) == record
    good = record.to_obj()
    bad_docs = [
        {**good, "extra": 1}, {k: v for k, v in good.items() if k != "steps"}, {**good, "index": True},
        {**good, "index": -1}, {**good, "state_in": "AB" * 32}, {**good, "checkpoint": "ab" * 31},
        {**good, "steps": []}, {**good, "steps": [["ab" * 32] * 2]}, {**good, "steps": "x"},
        {**good, "steps": [["ab" * 32] * 3] * (MAX_STEPS + 1)}, [good], "x"]
    for doc in bad_docs:
        with pytest.raises(BadRecord):
            SegmentRecord.from_obj(doc)
    for text in (b"\xff", b"[" * 100000, b"{"):
        with pytest.raises(BadRecord):
            SegmentRecord.from_json(text)


def test_merkle_proofs_match_the_ledger_root_and_reject_forgeries():
    for count in range(1, 34):
        items = [hashlib.sha256(bytes([i])).digest() for i in range(count)]
        top = root(items)
        for index in range(count):
            path = proof(items, index)
            assert verify_proof(top, items[index], index, count, path)
            assert not verify_proof(top, items[index], index ^ 1, count, path) or index ^ 1 >= count
            assert not verify_proof(top, items[index], index, count, path[::-1]) or len(path) < 2
            assert not verify_proof(top, items[(index + 1) % count], index, count, path) or count == 1
            if path:
                assert not verify_proof(top, items[index], index, count, path[:-1])
                assert not verify_proof(top, items[index], index, count, [bytes(32)] + path[1:])
            assert not verify_proof(top, items[index], index, count, path + [bytes(32)])
    items = [bytes(32)] * 4
    assert not verify_proof(root(items), items[0], True, 4, proof(items, 1))
    assert not verify_proof(root(items), items[0], 0, 4, ["x"] * 2)


def test_leaves_bind_task_worker_and_record():
    records = [_record(0), _record(1)]
    assert leaf(TASK, "a", records[0]) != leaf(TASK, "b", records[0]) != leaf(bytes(32), "b", records[0])
    with pytest.raises(BadRecord):
        leaves(TASK, "a", [records[1], records[0]])
    commitment = Commitment.of_records(TASK, "a", records, "cd" * 32)
    assert commitment.segments == 2 and commitment.segments_root == root(leaves(TASK, "a", records))


def test_state_files_reject_hostile_bytes():
    state = {"model": {"w": torch.ones(2, 2)}, "inner": {"state": {0: {"step": torch.tensor(3.0)}},
             "param_groups": [{"betas": (0.9, 0.99), "lr": 1e-3, "foreach": None}]}, "step": 7}
    data = state_bytes(state)
    assert state_bytes(load_state(data)) == data
    back = load_state(data)
    assert back["inner"]["param_groups"][0]["betas"] == (0.9, 0.99) and 0 in back["inner"]["state"]
    from safetensors.torch import save
    hostile = [b"", b"\x00" * 8, b"garbage" * 10,
               save({"t0": torch.ones(1)}, metadata={"dekube-state": '{"x":"t1"}'}),
               save({"t0": torch.ones(1), "t1": torch.ones(1)}, metadata={"dekube-state": '{"x":"t0"}'}),
               save({"t0": torch.ones(1)}, metadata={"dekube-state": '{"l":[{"x":"t0"},{"x":"t0"}]}'}),
               save({"t0": torch.ones(1)}, metadata={"dekube-state": '{"q":[]}'}),
               save({"t0": torch.ones(1)}, metadata={"dekube-state": '{"l":' * 200 + '1' + '}' * 200}),
               save({"t0": torch.ones(1)}, metadata={"dekube-state": '{"d":[[1,2],[1,3]]}'}),
               save({"t0": torch.ones(1)})]
    for data in hostile:
        with pytest.raises(BadStateFile):
            load_state(data)


def test_fault_modes_parse():
    for mode in ("lazy", "partial:0.1", "partial:1", "poison_zero", "poison_noise", "poison_stealth", "copycat"):
        Fault(mode)
    for mode in ("partial:2", "partial:", "poison", "lazy "):
        with pytest.raises(BadFault):
            Fault(mode)


def test_task_segments_v3_over_hosts(honest_dp):
    records, _ = honest_dp
    worker = "worker-peer"
    leaf_list = leaves(TASK, worker, records[0])
    committed = root(leaf_list)

    def lookup(task_id, index, segments):
        if task_id != TASK or index >= len(records[0]) or segments != len(leaf_list):
            return None
        return segments_protocol.SegmentAnswer(records[0][index], proof(leaf_list, index), len(leaf_list))

    async def scenario():
        server, client = Host(Identity.generate()), Host(Identity.generate())
        await server.start()
        await client.start()
        try:
            server.set_handler(segments_protocol.PROTOCOL, segments_protocol.make_record_handler(lookup))
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)
            answer = await segments_protocol.fetch_record(client, server.peer_id, TASK, 2, 3)
            with pytest.raises(segments_protocol.SegmentsError, match="no record"):
                await segments_protocol.fetch_record(client, server.peer_id, TASK, 7, 8)
            return answer
        finally:
            await client.stop()
            await server.stop()

    answer = asyncio.run(scenario())
    assert answer.record == records[0][2] and answer.count == 3
    segments_protocol.check_answer(answer, TASK, worker, committed, 3)
    with pytest.raises(BadRecord, match="committed 4"):
        segments_protocol.check_answer(answer, TASK, worker, committed, 4)
    with pytest.raises(BadRecord, match="Merkle"):   # a copycat serving another worker's records
        segments_protocol.check_answer(answer, TASK, "copycat-peer", committed, 3)
    other = dataclasses.replace(answer, record=records[0][1])
    with pytest.raises(BadRecord):
        segments_protocol.check_answer(other, TASK, worker, committed, 3)


def test_task_segments_v3_rejects_malformed_answers(honest_dp):
    records, _ = honest_dp
    record = records[0][1].to_obj()
    good = {"record": record, "proof": ["ab" * 32], "count": 3}
    assert segments_protocol.decode_answer(json.dumps(good).encode(), 1).count == 3
    bad = [{**good, "count": 0}, {**good, "count": True}, {**good, "proof": ["ab"]}, {**good, "proof": ["zz" * 32]},
           {**good, "proof": ["ab" * 32] * 65}, {**good, "extra": 1}, {**good, "record": {**record, "index": 2}},
           {"error": "no"}, [good]]
    for doc in bad:
        with pytest.raises(segments_protocol.SegmentsError):
            segments_protocol.decode_answer(json.dumps(doc).encode(), 1)
    with pytest.raises(segments_protocol.SegmentsError):
        segments_protocol.decode_answer(b"\xff", 1)
    with pytest.raises(segments_protocol.SegmentsError):
        segments_protocol.decode_request(TASK)
    assert segments_protocol.decode_request(TASK + struct.pack(">II", 5, 6)) == (TASK, 5, 6)
    for index, count in ((5, 5), (0, 0), (1, (1 << 20) + 1)):   # the index lies below the count, at most 2^20
        with pytest.raises(segments_protocol.SegmentsError):
            segments_protocol.decode_request(TASK + struct.pack(">II", index, count))
    with pytest.raises(ValueError):
        segments_protocol.encode_request(TASK, -1, 3)
    with pytest.raises(ValueError):
        segments_protocol.encode_request(TASK, 3, 3)


def test_a_committed_state_that_cannot_be_trained_from_is_a_mismatch(honest_dp):
    from node.artifacts.merkle import artifact_id_of_bytes

    records, sink = honest_dp
    record = records[1][1]
    for corrupt in ("optimizer", "model", "nan"):
        state = load_state(sink.blobs[record.checkpoint])
        if corrupt == "optimizer":
            state["inner"]["state"][0]["exp_avg"] = "not a tensor"
        elif corrupt == "model":
            state["model"] = {"junk": torch.zeros(1)}
        else:
            state["model"][next(iter(state["model"]))].view(-1)[0] = float("nan")
        data = state_bytes(state)
        forged = dataclasses.replace(record, checkpoint=artifact_id_of_bytes(data),
                                     state_in=hashlib.sha256(data).hexdigest())
        blobs = dict(sink.blobs) | {forged.checkpoint: data}
        got = replay_segment_blobs(DP, 1, WORLD, forged, blobs, None, SALT)
        assert not got.match and got.first_divergence in ((0, "state_in"), (0, "gradient")), corrupt


def test_judge_slot_audits_one_slot_over_hosts(honest_dp, tmp_path):
    """A verifier's whole audit of one slot (ml/compute/verification_flow.py): the record over
    /dekube/task-segments/2 checked against the on-chain root, the state files fetched, the replay."""
    from ml.compute.verification_flow import Sources, judge_slot, unavailable_evidence

    records, sink = honest_dp
    workers = ["peer-a", "peer-b", "peer-c"]
    for artifact, data in sink.blobs.items():
        (tmp_path / artifact).write_bytes(data)
    fetched = []

    async def artifact(artifact_id, holders):
        fetched.append((artifact_id, holders))
        return tmp_path / artifact_id

    async def scenario():
        server, client = Host(Identity.generate()), Host(Identity.generate())
        await server.start()
        await client.start()
        worker = server.peer_id
        ordered = sorted([worker, *workers[:2]])
        rank = ordered.index(worker)
        leaf_list = leaves(TASK, worker, records[rank])

        def lookup(task_id, index, segments):
            return segments_protocol.SegmentAnswer(records[rank][index], proof(leaf_list, index), len(leaf_list))

        async def record(peer, index, segments):
            return await segments_protocol.fetch_record(client, peer, TASK, index, segments, timeout_s=2)

        def task(segments_root):
            return TaskInfo.from_json({"task_id": TASK.hex(), "workers": ordered,
                                       "commits": {w: [segments_root.hex(), "00" * 32, 3, 1] for w in ordered}})

        try:
            server.set_handler(segments_protocol.PROTOCOL, segments_protocol.make_record_handler(lookup))
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)
            sources = Sources(record, artifact, {})
            good = await judge_slot(task(root(leaf_list)), DP, worker, 1, SALT, sources)
            forged = await judge_slot(task(bytes(32)), DP, worker, 1, SALT, sources)   # not under its root
            return good, forged, rank
        finally:
            await client.stop()
            await server.stop()

    good, forged, rank = asyncio.run(scenario())
    assert good.match and good.evidence == replay(DP, rank, records[rank][1], sink).evidence
    assert fetched[0] == (records[rank][1].checkpoint, [fetched[1][1][0]])
    assert not forged.match and forged.evidence == unavailable_evidence(SALT)


@pytest.mark.parametrize("mode", ["lazy", "partial:1", "poison_noise"])
def test_diloco_adversaries_are_caught_in_every_segment(mode):
    spec = TrainSpec(mode="diloco", steps=30, inner_steps=5, seed=6)
    records, sink = train(spec, {1: mode})
    for rank in range(WORLD):
        for record in records[rank]:
            got = replay(spec, rank, record, sink)
            assert got.match == (rank != 1) and (rank != 1 or got.first_divergence == (0, "gradient"))

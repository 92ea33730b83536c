"""Receiver-side evidence (docs/adr/0167): over the real TCP all-reduce, every worker's records hold
what it received from each other sender; `judge_slot` names a worker that commits its honest
contribution but sends zeros (`poison_stealth`), while one lying receiver cannot frame an honest sender."""
import asyncio
import dataclasses

import pytest
import torch

from consensus.task_info import TaskInfo
from ml.allreduce.payloads import encode_local
from ml.allreduce.receipts import chunk_ranges, expected_part_digest, payload_digest
from ml.codecs import get_codec
from ml.compute.segment_record import BadRecord, SegmentRecord, StepHashes, WireReceipt, leaves, proof, root
from ml.compute.segment_replay import replay_segment_blobs
from ml.compute.segments_protocol import SegmentAnswer
from ml.compute.verification_flow import Sources, judge_slot
from ml.compute.wire_evidence import Claim, honest_digest, wire_verdict
from ml.train.spec import TrainSpec
from tests.compute.test_networked_segment_records import TASK, train_over_tcp

SALT = b"\x07" * 32
PEERS = ["peer-0", "peer-1", "peer-2"]
INT8 = TrainSpec(steps=8, segment_steps=4, seed=5, codec="int8")
TOPK = TrainSpec(steps=8, segment_steps=4, seed=5, codec="topk", codec_options={"ratio": 0.05})
POWERSGD = TrainSpec(steps=8, segment_steps=4, seed=5, codec="powersgd2")
DILOCO = TrainSpec(mode="diloco", steps=20, inner_steps=5, seed=5, codec="int8")


def judge_all(spec, records, sink, tmp_path, segment=1):
    """judge_slot of every worker's `segment`, with records served under each worker's own root."""
    for artifact, data in sink.blobs.items():
        if not (tmp_path / artifact).exists():
            (tmp_path / artifact).write_bytes(data)
    by_worker = dict(zip(PEERS, records))
    leaf_lists = {w: leaves(TASK, w, r) for w, r in by_worker.items()}
    task = TaskInfo.from_json({"task_id": TASK.hex(), "workers": PEERS,
                               "commits": {w: [root(leaf_lists[w]).hex(), "00" * 32, len(leaf_lists[w]), 1]
                                           for w in PEERS}})

    async def record(worker, index):
        return SegmentAnswer(by_worker[worker][index], proof(leaf_lists[worker], index), len(leaf_lists[worker]))

    async def artifact(artifact_id, holders):
        return tmp_path / artifact_id

    sources = Sources(record, artifact, {})
    return [asyncio.run(judge_slot(task, spec, w, segment, SALT, sources)) for w in PEERS]


@pytest.fixture(scope="module", params=[INT8, TOPK, POWERSGD, DILOCO],
                ids=["butterfly-int8", "allgather-topk", "powersgd", "diloco"])
def stealthy(request):
    return request.param, *asyncio.run(train_over_tcp(request.param, 3, {2: "poison_stealth"}))


def test_records_hold_a_receipt_from_every_other_sender(stealthy):
    spec, records, _sink = stealthy
    for rank, worker_records in enumerate(records):
        for record in worker_records:
            assert SegmentRecord.from_json(record.canonical()) == record
            for offset, receipts in enumerate(record.received):
                assert {r.sender for r in receipts} == set(PEERS) - {PEERS[rank]}
                if spec.mode == "diloco":
                    assert {r.round for r in receipts} == {record.index}
                elif spec.codec == "powersgd2":   # two rounds a step: P and Q
                    assert len({r.round for r in receipts}) == 2
                else:
                    assert {r.round for r in receipts} == {record.index * spec.segment_steps + offset}
                if spec.codec != "topk":
                    assert all(r.chunk > 0 and r.start <= r.stop for r in receipts)
                else:
                    assert all((r.start, r.stop, r.chunk) == (0, 0, 0) for r in receipts)


def test_the_stealthy_poisoner_is_named_and_its_co_workers_match(stealthy, tmp_path):
    spec, records, sink = stealthy
    # its own replay matches: it committed its honest contribution
    assert replay_segment_blobs(spec, 2, 3, records[2][1], sink.blobs, None, SALT).match
    verdicts = judge_all(spec, records, sink, tmp_path)
    assert [v.match for v in verdicts] == [True, True, False], [v.reason for v in verdicts]
    assert verdicts[2].step == 0 and "receivers" in verdicts[2].reason
    # the evidence stays the replay's
    assert verdicts[2].evidence == replay_segment_blobs(spec, 2, 3, records[2][1], sink.blobs, None, SALT).evidence


def test_one_lying_receiver_does_not_frame_an_honest_sender(tmp_path):
    records, sink = asyncio.run(train_over_tcp(INT8, 3, {}))
    assert all(v.match for v in judge_all(INT8, records, sink, tmp_path))
    liar = [_lie_about(r, "peer-1") for r in records[0]]
    assert leaves(TASK, "peer-0", liar) != leaves(TASK, "peer-0", records[0])   # the leaf covers the receipts
    verdicts = judge_all(INT8, [liar, records[1], records[2]], sink, tmp_path)
    assert [v.match for v in verdicts] == [True, True, True], [v.reason for v in verdicts]
    # two receivers (the whole rest of the group) telling the same lie are a majority
    second = [_lie_about(r, "peer-1") for r in records[2]]
    verdicts = judge_all(INT8, [liar, records[1], second], sink, tmp_path)
    assert [v.match for v in verdicts] == [True, False, True]


def _lie_about(record, sender):
    received = tuple(tuple(dataclasses.replace(r, digest="00" * 32) if r.sender == sender else r for r in step)
                     for step in record.received)
    return dataclasses.replace(record, received=received)


def test_wire_verdict_needs_a_strict_majority_of_at_least_two():
    def claim(receiver, offset=0, round_id=0):
        return Claim(receiver, offset, WireReceipt(round_id, "w", "00" * 32, 0, 0, 0))

    assert wire_verdict([(claim("a"), False)]) is None                         # a lone receiver
    assert wire_verdict([(claim("a"), False), (claim("b"), True)]) is None     # one of two
    assert wire_verdict([(claim("a"), False), (claim("b"), False), (claim("c"), True)]) == 0
    assert wire_verdict([(claim("a", 0), True), (claim("b", 0), True),
                         (claim("a", 3, 7), False), (claim("b", 3, 7), False)]) == 3


def test_expected_digest_is_what_the_sender_puts_on_the_wire():
    flat = torch.randn(1000)
    for name in ("fp32", "fp16", "int8"):
        codec = get_codec(name)
        sent = payload_digest(encode_local(codec, flat[a:b], "me") for a, b in chunk_ranges(100, 900, 256))
        assert expected_part_digest(codec, flat, 100, 900, 256) == sent
    with pytest.raises(ValueError):
        expected_part_digest(get_codec("int8"), flat, 900, 1001, 256)
    # what a hostile receipt can make a judge compute is bounded
    huge = torch.zeros(1 << 20)
    assert honest_digest(get_codec("int8"), huge, None, WireReceipt(0, "w", "00" * 32, 0, 1 << 20, 1)) is None
    assert honest_digest(get_codec("int8"), flat, None, WireReceipt(0, "w", "00" * 32, 0, 2000, 256)) is None
    assert honest_digest(get_codec("int8"), flat, None, WireReceipt(0, "w", "00" * 32, 0, 0, 0)) is None


def test_receipts_reject_hostile_input():
    h = "ab" * 32
    good = SegmentRecord(0, h, h, h, (StepHashes(h, h, h),), h,
                         ((WireReceipt(3, "peer-1", h, 0, 10, 4),),))
    assert SegmentRecord.from_json(good.canonical()) == good
    obj = good.to_obj()
    for bad in ([], [[]] * 2, [[[3, "peer-1", h, 0, 10]]], [[[3, "", h, 0, 10, 4]]], [[[3, "p\n", h, 0, 10, 4]]],
                [[[True, "p", h, 0, 10, 4]]], [[[3, "p", "AB" * 32, 0, 10, 4]]], [[[3, "p", h, 5, 1, 4]]],
                [[[3, "p", h, 0, 10, 0]]], [[[3, "p", h, -1, 10, 4]]], [[[3, "p", h, 0, 1 << 48, 4]]],
                [[[3, "b", h, 0, 0, 0], [3, "a", h, 0, 0, 0]]], [[[3, "a", h, 0, 0, 0], [3, "a", h, 0, 0, 0]]],
                [[[3, "x" * 257, h, 0, 0, 0]]], [[[3, "a", h, 0, 0, 0]] * 1025], "x"):
        with pytest.raises(BadRecord):
            SegmentRecord.from_obj({**obj, "received": bad})
    with pytest.raises(BadRecord):
        SegmentRecord.from_obj({k: v for k, v in obj.items() if k != "received"})

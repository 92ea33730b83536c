"""Receiver-side evidence (docs/adr/0167, signed since docs/adr/0209): over the real TCP all-reduce, every
worker's records hold what it received from each other sender, signed by that sender; `judge_slot` names
a worker that commits its honest contribution but sends zeros (`poison_stealth`), while receivers lying
about an honest sender -- one, or every co-worker -- frame nobody and are named themselves."""
import asyncio
import dataclasses

import pytest
import torch

from consensus.task_info import TaskInfo
from ml.allreduce.payloads import encode_local
from ml.allreduce.receipts import chunk_ranges, expected_part_digest, payload_digest, receipt_message
from ml.codecs import get_codec
from ml.compute.segment_record import BadRecord, SegmentRecord, StepHashes, WireReceipt, leaves, proof, root
from ml.compute.segment_replay import replay_segment_blobs
from ml.compute.segments_protocol import SegmentAnswer
from ml.compute.verification_flow import Sources, judge_slot
from ml.compute.wire_evidence import Claim, honest_digest, unsigned_receipt, wire_verdict
from ml.train.spec import TrainSpec
from tests.compute.test_networked_segment_records import IDENTITIES, TASK, train_over_tcp
from tests.compute.test_networked_segment_records import PEERS as ALL_PEERS

SALT = b"\x07" * 32
PEERS = ALL_PEERS[:3]
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

    async def record(worker, index, segments):
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
    assert verdicts[2].step == 0 and "signature" in verdicts[2].reason
    # the evidence stays the replay's
    assert verdicts[2].evidence == replay_segment_blobs(spec, 2, 3, records[2][1], sink.blobs, None, SALT).evidence
    # one receiver's signed receipt is proof enough: the poisoner is named with the other's receipts gone
    alone = [_without(r, PEERS[2]) for r in records[0]]
    assert [v.match for v in judge_all(spec, [alone, records[1], records[2]], sink, tmp_path)] == [True, True, False]


def test_receivers_that_lie_frame_nobody_and_are_named(tmp_path):
    records, sink = asyncio.run(train_over_tcp(INT8, 3, {}))
    assert all(v.match for v in judge_all(INT8, records, sink, tmp_path))
    liar = [_lie_about(r, PEERS[1]) for r in records[0]]
    assert leaves(TASK, PEERS[0], liar) != leaves(TASK, PEERS[0], records[0])   # the leaf covers the receipts
    verdicts = judge_all(INT8, [liar, records[1], records[2]], sink, tmp_path)
    assert [v.match for v in verdicts] == [False, True, True], [v.reason for v in verdicts]
    assert "did not sign" in verdicts[0].reason
    # the whole rest of the group telling the same lie (before ADR 0209 a majority that convicted)
    second = [_lie_about(r, PEERS[1]) for r in records[2]]
    verdicts = judge_all(INT8, [liar, records[1], second], sink, tmp_path)
    assert [v.match for v in verdicts] == [False, True, False], [v.reason for v in verdicts]
    # a liar that drops the signature it cannot make is named all the same
    stripped = [_lie_about(r, PEERS[1], signature="") for r in records[0]]
    assert [v.match for v in judge_all(INT8, [stripped, records[1], records[2]], sink, tmp_path)] == [False, True, True]


def _lie_about(record, sender, signature=None):
    """`record` with its receipts of `sender` claiming other bytes (keeping the sender's signature of the
    bytes it did send, unless `signature` replaces it)."""
    def lie(r):
        return dataclasses.replace(r, digest="00" * 32, signature=r.signature if signature is None else signature)
    received = tuple(tuple(lie(r) if r.sender == sender else r for r in step) for step in record.received)
    return dataclasses.replace(record, received=received)


def _without(record, sender):
    return dataclasses.replace(record, received=tuple(tuple(r for r in step if r.sender != sender)
                                                      for step in record.received))


def _signed_receipt(identity, receiver, round_id=0, digest="00" * 32):
    message = receipt_message(TASK, round_id, identity.peer_id, receiver, digest, 0, 0, 0)
    return WireReceipt(round_id, identity.peer_id, digest, 0, 0, 0, identity.sign(message).hex())


def test_wire_verdict_counts_only_what_the_sender_signed():
    sender, a, b = (IDENTITIES[p] for p in PEERS)
    signed = _signed_receipt(sender, a.peer_id)

    def claim(receiver, receipt, offset=0):
        return Claim(receiver, offset, receipt)

    assert wire_verdict(TASK, [(claim(a.peer_id, signed), False)]) == 0             # one signed receipt is proof
    assert wire_verdict(TASK, [(claim(a.peer_id, signed), True)]) is None           # of the honest bytes
    assert wire_verdict(TASK, [(claim(b.peer_id, signed), False)]) is None          # signed for another receiver
    assert wire_verdict(bytes(32), [(claim(a.peer_id, signed), False)]) is None     # in another task
    forged = _signed_receipt(a, a.peer_id)                                          # signed by the receiver itself
    unsigned = dataclasses.replace(signed, signature="")
    other_round = dataclasses.replace(signed, round=1)
    assert wire_verdict(TASK, [(claim(a.peer_id, r), False) for r in (unsigned, other_round)]) is None
    assert wire_verdict(TASK, [(claim(a.peer_id, dataclasses.replace(forged, sender=sender.peer_id)), False)]) is None
    assert wire_verdict(TASK, [(claim(b.peer_id, unsigned, 0), False), (claim(a.peer_id, signed, 3), False)]) == 3
    # a record's own receipts: every one of sent bytes signed by its sender, else the record is false
    h = "ab" * 32
    record = SegmentRecord(0, h, h, h, (StepHashes(h, h, h),) * 2, h, ((signed,), (signed, unsigned)))
    assert unsigned_receipt(TASK, a.peer_id, record) == 1
    assert unsigned_receipt(TASK, b.peer_id, record) == 0
    empty = WireReceipt(0, sender.peer_id, h, 5, 5, 4)                              # an empty range sends nothing
    assert unsigned_receipt(TASK, a.peer_id, dataclasses.replace(record, received=((signed,), (empty,)))) is None


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
    signed = dataclasses.replace(good, received=((WireReceipt(3, "peer-1", h, 0, 10, 4, "cd" * 64),),))
    assert SegmentRecord.from_json(signed.canonical()) == signed and len(signed.to_obj()["received"][0][0]) == 7
    obj = good.to_obj()
    for bad in ([], [[]] * 2, [[[3, "peer-1", h, 0, 10]]], [[[3, "", h, 0, 10, 4]]], [[[3, "p\n", h, 0, 10, 4]]],
                [[[True, "p", h, 0, 10, 4]]], [[[3, "p", "AB" * 32, 0, 10, 4]]], [[[3, "p", h, 5, 1, 4]]],
                [[[3, "p", h, 0, 10, 0]]], [[[3, "p", h, -1, 10, 4]]], [[[3, "p", h, 0, 1 << 48, 4]]],
                [[[3, "b", h, 0, 0, 0], [3, "a", h, 0, 0, 0]]], [[[3, "a", h, 0, 0, 0], [3, "a", h, 0, 0, 0]]],
                [[[3, "x" * 257, h, 0, 0, 0]]], [[[3, "a", h, 0, 0, 0]] * 1025], "x",
                [[[3, "p", h, 0, 10, 4, ""]]], [[[3, "p", h, 0, 10, 4, "CD" * 64]]], [[[3, "p", h, 0, 10, 4, "cd"]]],
                [[[3, "p", h, 0, 10, 4, 7]]], [[[3, "p", h, 0, 10, 4, "cd" * 64, "x"]]]):
        with pytest.raises(BadRecord):
            SegmentRecord.from_obj({**obj, "received": bad})
    with pytest.raises(BadRecord):
        SegmentRecord.from_obj({k: v for k, v in obj.items() if k != "received"})

"""Records made over the real all-reduce (loopback TCP, the averager stack a compute node trains
through) replay alone from their checkpoints, for the group's own codec, all-gathered error feedback
and PowerSGD; a poisoner among them is named alone. The workers sign what they send (docs/adr/0209)."""
import asyncio

import pytest

from ml.allreduce import TcpTransport
from ml.compute.executor import make_group, prepare_trainer
from ml.compute.segment_replay import replay_segment_blobs
from ml.train.segments import MemorySink
from ml.train.spec import TrainSpec
from node.identity import Identity

TASK = bytes(range(32))
IDENTITIES = {i.peer_id: i for i in (Identity.from_seed(bytes([n + 1]) * 32) for n in range(4))}
PEERS = sorted(IDENTITIES)   # workers by rank


async def train_over_tcp(spec, world, faults):
    peers = PEERS[:world]
    transports = [TcpTransport(p) for p in peers]
    groups, sink = [], MemorySink()
    try:
        addresses = {p: await t.start() for p, t in zip(peers, transports)}
        for t in transports:
            t.addresses.update(addresses)
        groups = [make_group(spec, t, p, peers, TASK, identity=IDENTITIES[p]) for p, t in zip(peers, transports)]
        for g in groups:
            await g.start()
        trainers = [prepare_trainer(spec, g, sorted(peers).index(p), len(peers), sink=sink, fault=faults.get(i, ""))
                    for i, (p, g) in enumerate(zip(peers, groups))]
        await asyncio.gather(*(t.run() for t in trainers))
        return [t.recorder.records for t in trainers], sink
    finally:
        for g in groups:
            await g.close()
        for t in transports:
            await t.close()


@pytest.mark.parametrize("spec", [
    TrainSpec(steps=12, segment_steps=6, seed=4, codec="int8"),
    TrainSpec(steps=12, segment_steps=6, seed=4, codec="topk", codec_options={"ratio": 0.05}),
    TrainSpec(steps=12, segment_steps=6, seed=4, codec="powersgd2"),
    TrainSpec(mode="diloco", steps=20, inner_steps=5, seed=4, codec="int8"),
], ids=["int8", "topk-ef", "powersgd", "diloco"])
def test_networked_records_replay_and_name_the_poisoner(spec):
    records, sink = asyncio.run(train_over_tcp(spec, 3, {2: "poison_noise"}))
    assert [len(r) for r in records] == [spec.segment_count] * 3
    assert all(len({r[k].averages for r in records}) == 1 for k in range(spec.segment_count))
    for rank in range(3):
        for record in records[rank]:
            got = replay_segment_blobs(spec, rank, 3, record, sink.blobs, None, bytes(32))
            assert got.match == (rank != 2), (rank, record.index, got.first_divergence)
            if rank == 2:
                assert got.first_divergence == (0, "gradient")

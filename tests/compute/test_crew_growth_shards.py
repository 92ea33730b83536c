"""The data of a crew that grows (docs/adr/0234): from the epoch extra seats open, every member cuts the
data into as many shards as there are seats (`TrainerBase.reshard`, `executor.grow_crew`), disjoint within
each pass, and an auditor replays a segment of that epoch with the same cut (`replay_segment`'s world and
``shards_from``); a replay with the old cut does not match. Fails on the code before ADR 0234 (no
``reshard``: the data stayed cut for the seats asked at submit)."""
import asyncio

import pytest
import torch

from consensus.task_info import TaskInfo
from ml.compute.crew_changes import CrewGate
from ml.compute.executor import grow_crew
from ml.compute.segment_replay import replay_segment_blobs
from ml.job.participation import ParticipationLog
from ml.train.simulation import build_recorded, build_simulated
from ml.train.spec import TrainSpec

SALT = b"\x02" * 32
DP = TrainSpec(steps=30, segment_steps=10, seed=5)


def test_after_a_reshard_the_shards_of_one_pass_are_disjoint_and_cover_the_data():
    trainers = build_simulated(DP, 5)
    for trainer in trainers:
        trainer.reshard(5, 40)
    dataset = trainers[0].dataset
    per_pass = max(1, (dataset.num_train // 5) // DP.batch_size)
    seen = []
    for step in range(40, 40 + per_pass):
        for trainer in trainers:
            x, _ = trainer.batch_of(step, trainer.rank)
            seen.extend(tuple(row.tolist()) for row in x.reshape(len(x), -1))
    assert len(seen) == 5 * per_pass * DP.batch_size
    assert len(set(seen)) >= len(seen) - 2   # the digits split holds a couple of identical images


def test_a_reshard_starts_a_new_cut_and_leaves_the_old_one_alone():
    trainer = build_simulated(DP, 3)[0]
    before = trainer.batch_of(12, 0)[0].clone()
    trainer.reshard(3, 0)
    assert torch.equal(trainer.batch_of(12, 0)[0], before)   # the cut from step 0 is the one asked at submit
    trainer.reshard(4, 10)
    assert trainer.world == 4 and not torch.equal(trainer.batch_of(12, 0)[0], before)
    with pytest.raises(ValueError):
        trainer.reshard(0, 10)


def test_grow_crew_counts_full_rounds_over_the_new_world():
    trainer = build_simulated(DP, 3)[0]
    trainer.averager = ParticipationLog(trainer.averager, 3)
    grow_crew(trainer, 5, 20)
    assert trainer.world == 5 and trainer.shards_from == 20 and trainer.averager.workers == 5


@pytest.fixture(scope="module")
def grown_run():
    """Three workers that cut the data anew at step 10 (as a crew that grew at segment 1 does)."""
    trainers, sink = build_recorded(DP, 3)

    async def go():
        await asyncio.gather(*(t.run(until_step=10) for t in trainers))
        for trainer in trainers:
            grow_crew(trainer, 3, 10)
        await asyncio.gather(*(t.run() for t in trainers))
    asyncio.run(go())
    return [t.recorder.records for t in trainers], sink


def test_an_auditor_replays_a_grown_epoch_with_its_cut_and_not_with_the_old_one(grown_run):
    records, sink = grown_run
    record = records[1][2]   # worker 1, segment 2 (steps 20-29): after the new cut
    assert replay_segment_blobs(DP, 1, 3, record, sink.blobs, None, SALT, shards_from=10).match
    stale = replay_segment_blobs(DP, 1, 3, record, sink.blobs, None, SALT)
    assert not stale.match and stale.first_divergence[0] == 0
    before = records[1][0]   # segment 0 trained before the cut: replayed from step 0's cut
    assert replay_segment_blobs(DP, 1, 3, before, sink.blobs, None, SALT).match


class _Group:
    def __init__(self, peers):
        self.peers = list(peers)

    def set_peers(self, peers):
        self.peers = list(peers)

    def accept(self, peers):
        pass


class _Committer:
    async def wait_committed(self, epoch):
        return None


def _task(joined) -> TaskInfo:
    commits = {w: [["11" * 32, "33" * 32, 2 * (e + 1), 5] for e in range(2)] for w in ("a", "b", "c")}
    return TaskInfo.from_json({
        "task_id": "ab" * 32, "owner": "o", "status": "running", "spec": {"workers": 3, "max_workers": 5,
                                                                      "epochs": 4},
        "price": 100, "workers": ["a", "b", "c", *joined], "commits": {}, "segments": 8,
        "epochs": {"current": 2, "commits": commits, "joined": joined}})


def test_the_gate_reshards_at_the_epoch_the_extra_seats_open():
    cuts = []
    task = _task({"d": [3, 2], "e": [4, 2]})

    async def read():
        return task

    async def ready(peers, timeout):
        return list(peers)
    gate = CrewGate("a", 0, 2, _Committer(), read, _Group(["a", "b", "c"]), ready,
                    reshard=lambda world, segment: cuts.append((world, segment)), world=3)
    asyncio.run(gate(2))
    asyncio.run(gate(4))   # epoch 2: the world grows to five, cut from its first segment
    asyncio.run(gate(6))   # epoch 3: same world, no new cut
    assert cuts == [(5, 4)] and gate.joined[2] == ["d", "e"]

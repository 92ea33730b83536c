"""Bit-reproducible CPU training: identical runs, replay from checkpoints, segment hashes, progress."""
import asyncio
import dataclasses
import hashlib

import torch

from ml.compute.segment_replay import replay_segment_blobs
from ml.train.averaging import LocalAveragingGroup
from ml.train.progress import ProgressFeed
from ml.train.reproducibility import hash_tensors
from ml.train.simulation import (
    build_recorded,
    build_simulated,
    make_trainer,
    run_trainers,
    train_simulated,
)
from ml.train.spec import TrainSpec
from ml.train.state_file import load_state, state_bytes
from node.artifacts.merkle import artifact_id_of_bytes

DP = TrainSpec(steps=40, segment_steps=10, report_every=10, seed=5)
DILOCO = TrainSpec(mode="diloco", steps=20, inner_steps=5, seed=5)


def test_two_data_parallel_runs_are_bit_identical_and_workers_agree():
    first = train_simulated(DP, world=2)
    second = train_simulated(DP, world=2)
    hashes = {t.params_hash() for t in first.trainers + second.trainers}
    assert len(hashes) == 1
    assert len(first.trainers[0].segment_hashes) == 4
    assert first.trainers[0].segment_hashes == second.trainers[1].segment_hashes
    other_seed = train_simulated(TrainSpec(steps=40, segment_steps=10, seed=6), world=2)
    assert other_seed.trainers[0].params_hash() not in hashes


def test_data_parallel_segment_replays_from_checkpoint():
    async def scenario():
        trainers = build_simulated(DP, world=2)
        await asyncio.gather(*(t.run(until_step=20) for t in trainers))
        checkpoints = [t.checkpoint() for t in trainers]
        await run_trainers(trainers)
        replayed = build_simulated(DP, world=2)
        for t, checkpoint in zip(replayed, checkpoints):
            t.restore(checkpoint)
        assert replayed[0].step == 20
        await run_trainers(replayed)
        return trainers, replayed

    original, replayed = asyncio.run(scenario())
    assert replayed[0].segment_hashes == original[0].segment_hashes[2:]  # the history is not training state
    assert replayed[1].params_hash() == original[1].params_hash()


def test_error_feedback_residual_travels_in_the_checkpoint():
    spec = TrainSpec(steps=20, segment_steps=5, codec="sign", seed=1)

    def fresh():
        return make_trainer(spec, 0, 1, LocalAveragingGroup(1, "sign").member(0))

    async def scenario():
        original = fresh()
        await original.run(until_step=10)
        checkpoint = original.checkpoint()
        assert original.averager.compressor.residual.abs().sum() > 0
        await original.run()
        resumed = fresh()
        resumed.restore(checkpoint)
        await resumed.run()
        forgetful = fresh()
        forgetful.restore(checkpoint)
        forgetful.averager.compressor.load_state_dict({"residual": None})
        await forgetful.run()
        return original, resumed, forgetful

    original, resumed, forgetful = asyncio.run(scenario())
    assert resumed.params_hash() == original.params_hash()
    assert forgetful.params_hash() != original.params_hash()


def test_diloco_segment_replays_alone_from_its_checkpoint():
    trainers, sink = build_recorded(DILOCO, world=2)
    asyncio.run(run_trainers(trainers))
    worker = trainers[1]
    records = worker.recorder.records
    assert len(records) == DILOCO.outer_steps == DILOCO.segment_count == 4
    assert worker.segment_hashes != trainers[0].segment_hashes  # different shards, different deltas
    for record in (records[0], records[2], records[3]):
        replay = replay_segment_blobs(DILOCO, 1, 2, record, sink.blobs, None, bytes(32))
        assert replay.match and replay.first_divergence is None
    state = load_state(sink.blobs[records[2].checkpoint])
    state["model"][next(iter(state["model"]))].view(-1)[0] += 1e-3  # a tampered start state no longer replays
    tampered = state_bytes(state)
    blobs = dict(sink.blobs) | {records[2].checkpoint: tampered}
    assert replay_segment_blobs(DILOCO, 1, 2, records[2], blobs, None, bytes(32)).first_divergence == (0, "state_in")
    forged = dataclasses.replace(records[2], checkpoint=artifact_id_of_bytes(tampered),
                                 state_in=hashlib.sha256(tampered).hexdigest())
    blobs[forged.checkpoint] = tampered
    assert replay_segment_blobs(DILOCO, 1, 2, forged, blobs, None, bytes(32)).first_divergence == (0, "gradient")


def test_hash_tensors_sees_every_bit_shape_and_order():
    a = torch.arange(6, dtype=torch.float32)
    flipped = a.clone()
    flipped.view(torch.int32)[3] ^= 1
    assert hash_tensors([a]) != hash_tensors([flipped])
    assert hash_tensors([a]) != hash_tensors([a.view(2, 3)])
    assert hash_tensors([a, a[:2]]) != hash_tensors([a[:2], a])


def test_progress_reports_steps_loss_and_bytes_to_callbacks_and_streams():
    feed = ProgressFeed(history=100)
    seen = []
    feed.subscribe(seen.append)

    async def scenario():
        streamed = []

        async def consume():
            async for event in feed.stream():
                streamed.append(event)

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0)
        await run_trainers(build_simulated(DP, world=2, feed=feed))
        feed.close()
        await asyncio.wait_for(consumer, 5)
        return streamed

    streamed = asyncio.run(scenario())
    rank0 = [e for e in seen if e.rank == 0]
    assert [e.step for e in rank0] == [10, 20, 30, 40]
    assert all(e.loss > 0 and e.participants == 2 for e in rank0)
    assert [e.bytes_sent for e in rank0] == sorted(e.bytes_sent for e in rank0) and rank0[0].bytes_sent > 0
    assert "accuracy" in rank0[-1].metrics and rank0[-1].to_dict()["step"] == 40
    assert streamed == seen == feed.history


def test_spec_round_trips_and_rejects_bad_fields():
    import pytest

    from ml.train.spec import InvalidSpec

    spec = TrainSpec(mode="diloco", codec="powersgd2", steps=100, inner_steps=20)
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    assert spec.outer_steps == 5
    assert spec.lr_at(0) == spec.lr and spec.lr_at(99) < spec.lr / 100
    for bad in ({"codec": "zip"}, {"mode": "async"}, {"steps": 0}, {"lr": float("nan")},
                {"model": "gpt"}, {"mode": "diloco", "steps": 30, "inner_steps": 20},
                {"optimizer": "lion"}, {"colour": "red"}):
        with pytest.raises(InvalidSpec):
            TrainSpec.from_dict(bad)
    with pytest.raises(InvalidSpec):
        TrainSpec.from_dict(["not", "a", "dict"])


def test_compute_threads_use_the_configured_torch_thread_count():
    """torch.set_num_threads is per OS thread: a pool thread made before configure_determinism keeps
    the machine's core count, and a conv or matmul split over more threads rounds differently from
    the verifier's replay. in_compute_thread sets it in the thread that computes."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from ml.train.reproducibility import configure_determinism, in_compute_thread

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(4))
        await asyncio.gather(*(asyncio.to_thread(torch.get_num_threads) for _ in range(4)))  # threads exist
        configure_determinism(1)
        return await asyncio.gather(*(in_compute_thread(torch.get_num_threads) for _ in range(8)))
    assert set(asyncio.run(main())) == {1}

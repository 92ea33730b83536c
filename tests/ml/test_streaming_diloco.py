"""Streaming DiLoCo (ml/train/streaming_diloco.py, docs/adr/0191): the strided, staggered fragment
schedule; the int4 pseudo-gradient with error feedback; the outer step and the mix; the overlap (inner
steps go on while a fragment's all-reduce is in flight, and a slow one changes nothing but the wait);
bitwise reproducibility (same seed, restore from a checkpoint, replay of a worker's segment from its
records); convergence of 4 workers on digits at fewer bytes than DiLoCo + int8; a job over worker
processes and the real all-reduce (slow); the sync mode on the task path (ledger payload and back,
CLI choice)."""
import asyncio
import dataclasses
from typing import Any

import pytest
import torch
from accuracy_stats import assert_reaches, predictions_correct

from ml.codecs import get_codec
from ml.compute.segment_replay import replay_segment_blobs
from ml.compute.task_spec import submit_payload, train_spec_for_task
from ml.registry import get_dataset
from ml.train.averaging import Averaged, LocalAveragingGroup
from ml.train.compression import flatten
from ml.train.dry_run import Untrainable
from ml.train.recipes import recipe
from ml.train.simulation import build_recorded, build_simulated, make_trainer, train_simulated
from ml.train.spec import InvalidSpec
from ml.train.streaming_diloco import StreamingDiLoCoTrainer
from ml.train.streaming_schedule import FINAL, STREAM, WARM, fragment_of_params, layer_of, schedule

WORLD = 4
SHORT = recipe("digits-streaming", steps=80, inner_steps=20, warmup_steps=20, seed=5)


def run(trainers):
    async def go():
        return await asyncio.gather(*(t.run() for t in trainers))
    return asyncio.run(go())


# -- the schedule ------------------------------------------------------------------------------------

def test_fragments_are_synced_in_turn_every_h_steps_with_one_in_flight_and_none_at_segment_starts():
    spec = recipe("shakespeare-streaming", steps=240, inner_steps=30, warmup_steps=60, fragments=3, overlap_steps=4)
    rounds = schedule(spec)
    warm = [r for r in rounds if r.kind == WARM]
    assert [(r.start, r.due, r.fragments) for r in warm] == [(30, 30, (0, 1, 2)), (60, 60, (0, 1, 2))]
    stream = [r for r in rounds if r.kind == STREAM]
    assert [r.due for r in stream] == list(range(70, 241, 10))           # staggered H/P = 10 apart
    assert [r.fragments[0] for r in stream] == [0, 1, 2] * 6              # strided, in turn
    assert all(r.due - r.start == 4 for r in stream)                      # each overlaps tau steps
    for p in range(3):                                                    # each fragment every H steps
        dues = [r.due for r in stream if r.fragments == (p,)]
        assert {b - a for a, b in zip(dues, dues[1:])} == {30}
    assert all(nxt.start >= cur.due for cur, nxt in zip(rounds, rounds[1:]))   # one in flight at a time
    for k in range(spec.segment_count):
        cut = spec.first_step_of_segment(k)
        assert not any(r.start < cut < r.due for r in rounds)
        assert sum(r.segment == k for r in rounds) == spec.steps_in_segment(k)
        assert all(cut < r.due <= cut + 30 for r in rounds if r.segment == k)
    assert rounds[-1].kind == FINAL and rounds[-1].fragments == (0, 1, 2) and rounds[-1].due == 240
    assert [r.index for r in rounds] == list(range(len(rounds)))


def test_layers_are_strided_over_fragments():
    names = ["position", "embed.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.0.bias",
             "blocks.1.norm1.weight", "norm.bias", "head.weight"]
    assert [layer_of(n) for n in names] == ["position", "embed", "blocks.0", "blocks.0", "blocks.1", "norm", "head"]
    assert fragment_of_params(names, 2) == [0, 1, 0, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="layers"):
        fragment_of_params(["net.0.weight", "net.0.bias"], 2)


@pytest.mark.parametrize("overrides, message", [
    ({"overlap_steps": 10}, "overlap_steps"),      # H / P = 10: two fragments could be in flight
    ({"fragments": 3}, "multiple of fragments"),
    ({"codec": "topk"}, "dense codec"),
    ({"mix": 1.5}, "mix"),
    ({"steps": 90}, "multiple of inner_steps"),
])
def test_bad_streaming_specs_are_refused(overrides, message):
    with pytest.raises(InvalidSpec, match=message):
        recipe("digits-streaming", **overrides)


def test_the_sync_mode_travels_through_the_ledger_payload():
    spec = recipe("digits-streaming", mix=0.25, fragments=4, overlap_steps=3)
    payload = submit_payload(spec, 3, 1000)
    assert payload["sync_mode"] == "streaming"
    back = train_spec_for_task({k: payload[k] for k in ("model", "dataset", "codec", "sync_mode", "hyperparams")})
    assert back == spec
    from cli.task import spec_from_args
    args = type("Args", (), {"workers": 3, "model": "mlp", "dataset": "digits", "codec": "int4", "steps": 100,
                             "sync": "streaming", "inner_steps": 20, "segment_steps": None, "batch_size": None,
                             "lr": None, "seed": None})()
    assert spec_from_args(args).mode == "streaming-diloco"


# -- one round's arithmetic ------------------------------------------------------------------------------

def lone_trainer(spec=SHORT) -> StreamingDiLoCoTrainer:
    group = LocalAveragingGroup(1, spec.codec)
    trainer = make_trainer(spec, 0, 1, group.member(0))
    assert isinstance(trainer, StreamingDiLoCoTrainer)
    return trainer


def test_the_contribution_is_the_pseudo_gradient_plus_residual_and_the_residual_what_int4_lost():
    trainer = lone_trainer()
    rnd = next(r for r in trainer.rounds if r.kind == STREAM)
    members = trainer._indices(rnd.fragments)
    gen = torch.Generator().manual_seed(1)
    codec = get_codec("int4")
    carried = torch.zeros(trainer.residuals[rnd.fragments[0]].numel())
    for _ in range(3):
        with torch.no_grad():
            for i in members:
                trainer.params[i].add_(torch.randn(trainer.params[i].shape, generator=gen) * 1e-2)
        delta = flatten([trainer.anchor[i] - trainer.params[i] for i in members])
        sent = flatten(trainer._contribution(rnd))
        assert torch.equal(sent, delta + carried)
        residual = trainer.residuals[rnd.fragments[0]]
        assert torch.equal(residual, sent - codec.decode(codec.encode(sent), sent.numel()))
        assert residual.abs().max() > 0
        carried = residual
    other = 1 - rnd.fragments[0]
    assert not trainer.residuals[other].any()   # untouched fragment


def test_error_feedback_keeps_the_decoded_sum_within_one_round_of_the_true_sum():
    trainer = lone_trainer()
    rnd = next(r for r in trainer.rounds if r.kind == STREAM)
    members = trainer._indices(rnd.fragments)
    codec = get_codec("int4")
    gen = torch.Generator().manual_seed(2)
    true_sum = decoded_sum = plain_sum = torch.zeros(0)
    for n in range(20):
        with torch.no_grad():
            for i in members:   # a steady drift: what int4 drops each round is sent later
                drift = 1e-3 * (1 + torch.rand(trainer.params[i].shape, generator=gen))
                trainer.params[i].copy_(trainer.anchor[i] - drift)
        delta = flatten([trainer.anchor[i] - trainer.params[i] for i in members])
        sent = flatten(trainer._contribution(rnd))
        decoded = codec.decode(codec.encode(sent), sent.numel())
        plain = codec.decode(codec.encode(delta), delta.numel())   # what it would send without feedback
        true_sum, decoded_sum, plain_sum = ((delta, decoded, plain) if n == 0 else
                                            (true_sum + delta, decoded_sum + decoded, plain_sum + plain))
    residual = trainer.residuals[rnd.fragments[0]]
    assert torch.allclose(decoded_sum + residual, true_sum, atol=1e-5)
    assert (decoded_sum - true_sum).abs().max() < 0.5 * (plain_sum - true_sum).abs().max()


def test_a_stream_round_steps_the_anchor_and_mixes_a_final_round_copies():
    trainer = lone_trainer()
    stream = next(r for r in trainer.rounds if r.kind == STREAM)
    members = trainer._indices(stream.fragments)
    with torch.no_grad():
        for p in trainer.params:
            p.add_(0.01)
    local = [p.detach().clone() for p in trainer.params]
    anchor = [a.clone() for a in trainer.anchor]
    average = [torch.full_like(trainer.params[i], 0.02) for i in members]
    reference = [anchor[i].clone().requires_grad_() for i in members]
    outer = torch.optim.SGD(reference, lr=SHORT.outer_lr, momentum=SHORT.outer_momentum, nesterov=True)
    for r, g in zip(reference, average):
        r.grad = g.clone()
    outer.step()
    trainer._apply(stream, average, 1)
    for k, i in enumerate(members):
        assert torch.equal(trainer.anchor[i], reference[k].detach())
        assert torch.allclose(trainer.params[i], 0.5 * local[i] + 0.5 * reference[k].detach())
    for i in set(range(len(local))) - set(members):   # the other fragment is left alone
        assert torch.equal(trainer.params[i], local[i]) and torch.equal(trainer.anchor[i], anchor[i])
    final = trainer.rounds[-1]
    trainer._apply(final, [torch.zeros_like(trainer.params[i]) for i in trainer._indices(final.fragments)], 1)
    assert all(torch.equal(p, a) for p, a in zip(trainer.params, trainer.anchor))


def test_outer_momentum_zero_is_a_plain_outer_sgd_step():
    trainer = lone_trainer(dataclasses.replace(SHORT, outer_lr=1.0, outer_momentum=0.0))
    stream = next(r for r in trainer.rounds if r.kind == STREAM)
    members = trainer._indices(stream.fragments)
    anchor = [a.clone() for a in trainer.anchor]
    average = [torch.full_like(trainer.params[i], 0.02) for i in members]
    for _ in range(2):   # no momentum carries over from the first step into the second
        trainer._apply(stream, average, 1)
    for k, i in enumerate(members):
        assert torch.allclose(trainer.anchor[i], anchor[i] - 2 * average[k])


# -- the overlap -----------------------------------------------------------------------------------------

class SlowAverager:
    """Delays every round's average by `delay` seconds; notes the worker's step when each round was
    handed over and when its average was taken."""

    def __init__(self, inner, delay: float):
        self.inner, self.delay = inner, delay
        self.trainer: Any = None
        self.handed: list[int] = []
        self.finished: list[int] = []

    async def average(self, tensors, round_id: int) -> Averaged:
        self.handed.append(self.trainer.step)
        result = await self.inner.average(tensors, round_id)
        await asyncio.sleep(self.delay)
        self.finished.append(self.trainer.step)
        return result


def slow_run(delay: float, spec=SHORT, world: int = 2):
    group = LocalAveragingGroup(world, spec.codec)
    wrapped = [SlowAverager(group.member(rank), delay) for rank in range(world)]
    trainers = [make_trainer(spec, rank, world, wrapped[rank]) for rank in range(world)]
    for w, t in zip(wrapped, trainers):
        w.trainer = t
    run(trainers)
    return trainers, wrapped


def test_inner_steps_go_on_while_an_all_reduce_is_in_flight_and_a_slow_one_changes_only_the_wait():
    fast, _ = slow_run(0.0)
    slow, wrapped = slow_run(0.3)
    rounds = slow[0].rounds
    stream = [r.index for r in rounds if r.kind == STREAM]
    # the worker was tau steps further when the slow average landed: it did not stop for the network
    assert [wrapped[0].finished[i] for i in stream] == [rounds[i].due for i in stream]
    assert [wrapped[0].handed[i] for i in stream] == [rounds[i].start for i in stream]
    assert all(rounds[i].due > rounds[i].start for i in stream)
    assert slow[0].wait_seconds > 0.1 * len(stream)    # tau steps do not hide 0.3 s: it waited the rest
    assert fast[0].wait_seconds < slow[0].wait_seconds
    assert [t.params_hash() for t in slow] == [t.params_hash() for t in fast]   # timing never leaks in
    assert len({t.params_hash() for t in slow}) == 1   # the final round leaves one model


# -- reproducibility -------------------------------------------------------------------------------------

def test_two_runs_with_one_seed_give_the_same_bits_and_the_segments_replay():
    trainers, sink = build_recorded(SHORT, WORLD)
    run(trainers)
    again = build_simulated(SHORT, WORLD)
    run(again)
    assert [t.params_hash() for t in trainers] == [t.params_hash() for t in again]
    assert len({t.params_hash() for t in trainers}) == 1
    assert [t.segment_hashes for t in trainers] == [t.segment_hashes for t in again]
    records = trainers[2].recorder.records
    assert [len(r.steps) for r in records] == [SHORT.steps_in_segment(k) for k in range(SHORT.segment_count)]
    for index in range(SHORT.segment_count):   # warm, streaming, last (with the final round)
        replay = replay_segment_blobs(SHORT, 2, WORLD, records[index], sink.blobs, None, bytes(32))
        assert replay.match, (index, replay.first_divergence)
    # a record whose average differs from the committed one's hash is caught
    forged = dataclasses.replace(records[1], steps=(records[1].steps[0],
                                                    dataclasses.replace(records[1].steps[1], average="00" * 32)))
    assert replay_segment_blobs(SHORT, 2, WORLD, forged, sink.blobs, None, bytes(32)).first_divergence == (1, "average")


def test_workers_restored_from_their_segment_checkpoints_continue_to_the_same_bits():
    trainers, sink = build_recorded(SHORT, 2)
    run(trainers)
    group = LocalAveragingGroup(2, SHORT.codec)
    resumed = [make_trainer(SHORT, rank, 2, group.member(rank)) for rank in range(2)]
    for old, new in zip(trainers, resumed):
        new.restore(sink.blobs[old.recorder.records[2].checkpoint])
        assert (new.step, new.outer_step) == (40, 2)
        assert new.next_round == next(r.index for r in new.rounds if r.segment == 2)
        assert new.residuals[0].any()   # the error-feedback residual travels in the checkpoint
    run(resumed)
    assert [t.params_hash() for t in resumed] == [t.params_hash() for t in trainers]


def test_a_model_with_fewer_layers_than_fragments_is_untrainable():
    spec = recipe("digits-streaming", fragments=4, overlap_steps=1)   # digits-mlp has 3 layers
    with pytest.raises(Untrainable, match="4 fragments need at least as many layers"):
        lone_trainer(spec)


def test_a_checkpoint_of_another_model_is_refused():
    trainer = lone_trainer()
    state = trainer.training_state()
    state["anchor"] = state["anchor"][:-1]
    with pytest.raises(ValueError):
        lone_trainer().load_training_state(state)


# -- convergence and bytes ---------------------------------------------------------------------------

def test_four_workers_converge_on_digits_with_fewer_bytes_than_diloco_int8():
    streaming = train_simulated(recipe("digits-streaming", steps=600), WORLD)
    diloco = train_simulated(recipe("digits-diloco", steps=600, codec="int8"), WORLD)
    assert len({t.params_hash() for t in streaming.trainers}) == 1
    assert_reaches(predictions_correct(streaming.trainers[0].model, get_dataset("digits")), 94.0)
    assert streaming.metrics[0]["loss"] < 0.3
    assert streaming.bytes_sent_per_worker < 0.7 * diloco.bytes_sent_per_worker
    assert all(0 < t.compute_seconds for t in streaming.trainers)


@pytest.mark.slow
@pytest.mark.timeout(900)   # two worker processes over loopback TCP: ~3 minutes on a loaded machine
def test_a_job_over_worker_processes_ends_with_one_model_on_every_worker():
    """The network all-reduce (int4 in shards) rounds differently from the simulation, so the check is
    that the workers agree and every segment was committed."""
    from ml.compute.local_job import run_local_job

    spec = dataclasses.replace(SHORT, report_every=20)
    results = asyncio.run(run_local_job(spec, 2, transport="tcp", timeout=600))
    assert [r["participants"] for r in results] == [["worker-0", "worker-1"]] * 2
    assert len({r["params_hash"] for r in results}) == 1
    assert all(len(r["segment_hashes"]) == spec.segment_count for r in results)
    assert all(0 < r["bytes_sent"] < 2 * train_simulated(spec, 2).bytes_sent_per_worker for r in results)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_streaming_on_cuda_is_reproducible_and_ends_with_one_model():
    spec = dataclasses.replace(SHORT, device="cuda")
    runs = [train_simulated(spec, 2) for _ in range(2)]
    assert runs[0].trainers[0].anchor[0].device.type == "cuda"
    assert {t.params_hash() for r in runs for t in r.trainers} == {runs[0].trainers[0].params_hash()}
    assert runs[0].trainers[0].segment_hashes == runs[1].trainers[1].segment_hashes

"""Issue 23 item 5 at CI size: the GPT-style decoder of devtools/gpt_decoder.py (the ~100M model's own
code, tiny config) as a user's `.pt2` archive, trained by the workers' trainer in streaming DiLoCo mode
(int4 outer gradients, two fragments, the all-reduce overlapped) on two in-process workers keeping
segment records, as the network's workers do. The held-out loss goes down, the auditor's replay of a
worker's segments from their checkpoints reaches the committed hashes, and the trained weights load
strictly into the user's class, which computes what the workers' graph computes.

The real ~100M configuration runs in bench/gpt_decoder.py (a few steps on CPU: step time, bytes per
outer step, peak memory).
"""
from __future__ import annotations

import asyncio
import dataclasses
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load, save_file

from devtools.gpt_decoder import BIG, GPT, TINY, export_archive
from ml.compute.segment_replay import replay_segment_blobs
from ml.train.dry_run import dry_run
from ml.train.file_dataset import load_file_dataset
from ml.train.simulation import build_recorded, run_trainers
from ml.train.spec import TrainSpec
from tests.ml.byo import artifact_id, files_of


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    load_file_dataset.cache_clear()


def token_file(path, vocab: int, n: int = 8192):
    rng = np.random.default_rng(0)
    tokens = (np.arange(n) * 7 + rng.integers(0, 3, n)) % vocab   # a pattern with some noise to learn
    save_file({"tokens": torch.from_numpy(tokens.astype(np.int64))}, str(path))
    return path


def test_the_big_config_is_a_hundred_million_parameters():
    with torch.device("meta"):
        model = GPT(BIG)
    count = sum(p.numel() for p in model.parameters())
    assert 90e6 <= count <= 110e6 and len(model.blocks) == 12 and model.head.in_features == 768


def test_tiny_gpt_archive_trains_streaming_replays_and_loads_strictly(tmp_path):
    user = export_archive(TINY, tmp_path / "gpt.pt2")
    data = token_file(tmp_path / "tokens.safetensors", TINY.vocab)
    files = files_of(tmp_path / "gpt.pt2", data)
    spec = TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(tmp_path / "gpt.pt2"),
                     dataset_artifact=artifact_id(data), mode="streaming-diloco", codec="int4", optimizer="adamw",
                     lr=1e-2, steps=32, inner_steps=4, fragments=2, overlap_steps=1, warmup_steps=4, batch_size=8,
                     report_every=32, seed=5)
    before = dry_run(spec, files, world=2)
    assert before["params"] == sum(p.numel() for p in user.parameters())

    trainers, sink = build_recorded(spec, 2, files=files)
    metrics = asyncio.run(run_trainers(trainers)).metrics
    assert math.isfinite(metrics[0]["loss"])
    assert metrics[0]["loss"] < 0.8 * before["metrics"]["loss"], (before["metrics"], metrics[0])
    assert trainers[0].bytes_sent > 0
    weights = [t.weights_bytes() for t in trainers]
    assert weights[0] == weights[1]   # the final round leaves every worker with the same bits

    records = trainers[1].recorder.records
    assert len(records) == spec.segment_count == spec.outer_steps
    for index in (1, len(records) // 2, len(records) - 1):   # warm start done, mid-run, and the final round
        replay = replay_segment_blobs(spec, 1, 2, records[index], sink.blobs, files, bytes(32))
        assert replay.match, (index, replay)

    initial = {k: v.clone() for k, v in user.state_dict().items()}
    user.load_state_dict(load(weights[0]), strict=True)
    assert any(not torch.equal(initial[k], v) for k, v in user.state_dict().items())
    x = torch.randint(0, TINY.vocab, (3, TINY.context))
    with torch.no_grad():
        torch.testing.assert_close(user(x), trainers[0].model(x), rtol=1e-4, atol=1e-5)


def test_a_tampered_record_does_not_replay(tmp_path):
    """The replay above could not pass by accident: the same segment with another state_out fails."""
    export_archive(TINY, tmp_path / "gpt.pt2")
    data = token_file(tmp_path / "tokens.safetensors", TINY.vocab)
    files = files_of(tmp_path / "gpt.pt2", data)
    spec = TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(tmp_path / "gpt.pt2"),
                     dataset_artifact=artifact_id(data), mode="streaming-diloco", codec="int4", steps=8,
                     inner_steps=4, fragments=2, overlap_steps=1, batch_size=8, report_every=8, seed=5)
    trainers, sink = build_recorded(spec, 2, files=files)
    asyncio.run(run_trainers(trainers))
    record = trainers[0].recorder.records[0]
    forged = dataclasses.replace(record, state_out="0" * 64)
    assert not replay_segment_blobs(spec, 0, 2, forged, sink.blobs, files, bytes(32)).match

"""Dropout through the audit path: a model with dropout (exported in train mode, as the README shows)
trains on workers whose per-segment records a verifier replays bit for bit (ml.compute.segment_replay,
docs/adr/0185: the generator is seeded per step from the task, the worker and the step, and held by
one thread at a time, docs/adr/0196: the two workers here train in threads of one process), while a
replay whose dropout masks come from another seed differs at the first step."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from ml.compute.segment_replay import replay_segment_blobs
from ml.train.file_dataset import load_file_dataset
from ml.train.simulation import build_recorded, run_trainers
from tests.ml.byo import files_of
from tests.models.test_conformance import dataset_for, export_as_a_user, spec_for
from tests.models.zoo import ARCHS

WORLD = 2
SALT = b"\x02" * 32


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    load_file_dataset.cache_clear()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dropout")
    arch = next(a for a in ARCHS if a.name == "layernorm-dropout")
    _, model = export_as_a_user(arch, folder / "model.pt2")
    data = dataset_for(arch.kind, folder / "data.npz")
    spec = replace(spec_for(model, data), steps=4, segment_steps=2)
    files = files_of(model, data)
    trainers, sink = build_recorded(spec, WORLD, files=files)
    asyncio.run(run_trainers(trainers))
    return spec, files, [t.recorder.records for t in trainers], sink


def test_a_verifier_replays_every_segment_of_a_dropout_model(recorded):
    spec, files, records, sink = recorded
    for rank in range(WORLD):
        for record in records[rank]:
            replayed = replay_segment_blobs(spec, rank, WORLD, record, sink.blobs, files, SALT)
            assert replayed.match, (rank, record.index, replayed.first_divergence)


def test_masks_drawn_from_another_seed_do_not_replay(recorded, monkeypatch):
    import ml.train.worker as worker
    from ml.train.op_randomness import step_randomness

    spec, files, records, sink = recorded
    monkeypatch.setattr(worker, "step_randomness",
                        lambda seed, rank, step, device="cpu": step_randomness(seed + 1, rank, step, device))
    replayed = replay_segment_blobs(spec, 0, WORLD, records[0][0], sink.blobs, files, SALT)
    assert not replayed.match and replayed.first_divergence[0] == 0   # the first step's gradient differs

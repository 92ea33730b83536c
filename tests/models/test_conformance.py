"""Conformance: architectures people bring (tests/models/zoo.py), each exported as the README's "Bring
your own model" shows (torch.export with a dynamic batch dimension), pass the dry run, train a few steps
on two workers with the trainer the network's workers run (ml.train.simulation.make_trainer: the same
DataParallelTrainer, its all-reduce in process), agree bit for bit, and their trained weights load with
load_state_dict(strict=True) into the user's own class, which then computes what the workers' model does.

Fast tier (CI): the models marked fast in the zoo (the issue's GRU, MultiheadAttention and
TransformerEncoderLayer among them). DEKUBE_SLOW=1: every model, and the issue's models trained by
compute nodes through `task submit` on a local devnet (tests/models/test_submit_e2e.py; `task run`'s
local worker processes take registry models only, so the devnet is the network path for an archive).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load, save_file

from ml.train.dry_run import dry_run
from ml.train.file_dataset import load_file_dataset
from ml.train.op_randomness import step_randomness
from ml.train.simulation import train_simulated
from ml.train.spec import TrainSpec
from tests.ml.byo import artifact_id, files_of
from tests.models.libs import library_or_skip
from tests.models.zoo import ARCHS, CLASSES, INPUTS, VOCAB, Arch

STEPS = 3


def _param(arch: Arch):
    marks = [] if arch.fast else [pytest.mark.slow]
    return pytest.param(arch, id=arch.name, marks=marks)


def export_as_a_user(arch: Arch, path: Path) -> tuple[torch.nn.Module, Path]:
    """The user's model (their own instance, seeded) and its archive, exported with a dynamic batch."""
    if arch.requires:
        library_or_skip(arch.requires)
    torch.manual_seed(0)
    model = arch.build()
    batch = torch.export.Dim("batch", min=1, max=65536)
    torch.export.save(torch.export.export(model, (arch.example(),), dynamic_shapes=({0: batch},)), str(path))
    return model, path


def dataset_for(kind: str, path: Path) -> Path:
    """A small dataset of `kind` with some signal to learn."""
    rng = np.random.default_rng(0)
    if kind == "tokens":
        tokens = (np.arange(4096) * 7 + rng.integers(0, 3, 4096)) % VOCAB
        save_file({"tokens": torch.from_numpy(tokens.astype(np.int64))}, str(path))
        return path
    x = rng.random((160, *INPUTS[kind]().shape[1:]), dtype=np.float32)
    y = (x.reshape(len(x), -1)[:, :8].sum(1) * 7).astype(np.int64) % CLASSES[kind]
    with open(path, "wb") as f:
        np.savez(f, x=x, y=y)
    return path


def spec_for(model: Path, data: Path, **options) -> TrainSpec:
    return TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model), dataset_artifact=artifact_id(data),
                     optimizer="adamw", lr=1e-3, steps=STEPS, batch_size=8, segment_steps=STEPS, report_every=STEPS,
                     seed=5, **options)


def assert_user_model_matches(user: torch.nn.Module, weights: bytes, trained: torch.nn.Module, arch: Arch,
                              seed: int) -> None:
    """The user's class takes the weights strictly and computes what the trained graph computes (the
    same seeded draws for dropout; train mode, as the graph was exported)."""
    user.load_state_dict(load(weights), strict=True)
    user.train()
    x = arch.example()
    with torch.no_grad(), step_randomness(seed, 0, 10**6):
        theirs = user(x)
    with torch.no_grad(), step_randomness(seed, 0, 10**6):
        ours = trained(x)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _fresh_dataset_cache():
    load_file_dataset.cache_clear()


@pytest.mark.parametrize("arch", [_param(a) for a in ARCHS])
def test_architecture_dry_runs_trains_and_loads_strictly(arch: Arch, tmp_path):
    user, model = export_as_a_user(arch, tmp_path / "model.pt2")
    data = dataset_for(arch.kind, tmp_path / ("data.safetensors" if arch.kind == "tokens" else "data.npz"))
    spec, files = spec_for(model, data), files_of(model, data)

    checked = dry_run(spec, files, world=2)
    assert math.isfinite(checked["loss"]) and checked["params"] == sum(p.numel() for p in user.parameters())

    run = train_simulated(spec, 2, files=files)
    weights = [t.weights_bytes() for t in run.trainers]
    # the workers' parameters agree bit for bit (batch-norm running statistics are each worker's own)
    names = dict(user.named_parameters(remove_duplicate=False)).keys()
    params = [{name: value for name, value in load(w).items() if name in names} for w in weights]
    assert params[0].keys() == names
    assert all(torch.equal(params[0][name], params[1][name]) for name in params[0])
    if not list(user.buffers()):
        assert weights[0] == weights[1] and run.trainers[0].segment_hashes == run.trainers[1].segment_hashes
    initial = {k: v.clone() for k, v in user.state_dict().items()}
    assert any(not torch.equal(initial[k], v) for k, v in load(weights[0]).items())   # it trained
    assert all(math.isfinite(v) for v in run.metrics[0].values())
    assert_user_model_matches(user, weights[0], run.trainers[0].model, arch, spec.seed)


def test_the_zoo_has_thirty_architectures_from_three_libraries():
    assert len(ARCHS) >= 30 and len({a.name for a in ARCHS}) == len(ARCHS)
    assert {a.requires for a in ARCHS} == {"", "torchvision", "transformers"}
    fast = [a.name for a in ARCHS if a.fast]
    assert {"gru", "multihead-attention-causal", "transformer-encoder-layer"} <= set(fast)

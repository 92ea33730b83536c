"""Datasets from files: each format, the held-out split, deterministic sharding, and training on them."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ml.train.file_dataset import DatasetError, load_file_dataset
from ml.train.inputs import build_inputs
from ml.train.simulation import train_simulated
from ml.train.spec import TrainSpec
from tests.ml.byo import TinyLM, artifact_id, digits_arrays, digits_npz, export, files_of


def _load(*paths, **kwargs):
    load_file_dataset.cache_clear()
    return load_file_dataset(*(str(p) for p in paths), **kwargs)


@pytest.mark.parametrize("keys", [("x", "y"), ("features", "labels")])
def test_npz_classification_with_either_key_pair(tmp_path, keys):
    data = _load(digits_npz(tmp_path / "d.npz", keys))
    assert data.kind == "classification" and data.default_loss == "cross_entropy"
    assert data.num_features == 64 and data.num_classes == 10
    assert data.num_train + len(data.held_out.y) == 1797 and len(data.held_out.y) == 180


def test_safetensors_classification_equals_npz(tmp_path):
    x, y = digits_arrays()
    save_file({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, str(tmp_path / "d.safetensors"))
    a = _load(tmp_path / "d.safetensors")
    b = _load(digits_npz(tmp_path / "d.npz"))
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.held_out.y, b.held_out.y)
    assert torch.equal(a.train_batch(3, 1, 3, 16, 7)[0], b.train_batch(3, 1, 3, 16, 7)[0])


def test_float_labels_make_a_regression_set_trained_with_mse(tmp_path):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(600, 4, generator=gen, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    np.savez(tmp_path / "r.npz", x=x.numpy(), y=y.numpy())
    data = _load(tmp_path / "r.npz")
    assert data.kind == "regression" and data.train.x.dtype == torch.float32
    model = export(torch.nn.Linear(4, 1), torch.rand(3, 4), tmp_path / "lin.pt2")
    files = files_of(model, tmp_path / "r.npz")
    spec = TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model),
                     dataset_artifact=artifact_id(tmp_path / "r.npz"), optimizer="adamw", lr=0.05, steps=150,
                     batch_size=32, segment_steps=50, report_every=50)
    before = build_inputs(spec, files).evaluate()["mse"]
    after = train_simulated(spec, 2, files=files).metrics[0]["mse"]
    assert after < before / 10


def test_text_byte_and_char_tokens(tmp_path):
    text = "to be or not to be, that is the question. " * 50 + "é"
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    by_byte = _load(tmp_path / "t.txt", tokenizer="byte", context=16)
    assert by_byte.kind == "tokens" and by_byte.vocab_size == 256
    assert len(by_byte.train) + len(by_byte.held_out) == len(text.encode())
    by_char = _load(tmp_path / "t.txt", tokenizer="char", context=16)
    assert by_char.vocab_size == len(set(text))
    x, y = by_char.train_batch(0, 1, 2, 4, 0)
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    vocab = sorted(set(text))
    assert "".join(vocab[i] for i in by_char.train[:10].tolist()) == text[:10]
    with pytest.raises(DatasetError, match="not in the training text's vocabulary"):
        (tmp_path / "e.txt").write_text("xyz#", encoding="utf-8")
        _load(tmp_path / "t.txt", tmp_path / "e.txt", tokenizer="char", context=2)


def test_token_tensor_dataset_trains_a_language_model_with_bits_per_token(tmp_path):
    tokens = torch.tensor(list(b"abcabcabdabcabcabd" * 200), dtype=torch.int32)
    save_file({"tokens": tokens}, str(tmp_path / "tok.safetensors"))
    model = export(TinyLM(), torch.zeros(2, 16, dtype=torch.int64), tmp_path / "lm.pt2")
    files = files_of(model, tmp_path / "tok.safetensors")
    spec = TrainSpec(model="pt2", dataset="file", model_artifact=artifact_id(model),
                     dataset_artifact=artifact_id(tmp_path / "tok.safetensors"), lr=0.02, steps=60,
                     batch_size=8, segment_steps=20, report_every=20)
    inputs = build_inputs(spec, files)
    assert inputs.dataset.kind == "tokens" and inputs.dataset.context == 16   # from the archive's input
    before = inputs.evaluate()
    after = train_simulated(spec, 2, files=files).metrics[0]
    assert set(after) == {"loss", "bits_per_token"}
    assert after["bits_per_token"] < before["bits_per_token"] / 2


def test_eval_artifact_is_the_held_out_set(tmp_path):
    x, y = digits_arrays()
    np.savez(tmp_path / "train.npz", x=x[:1500], y=y[:1500])
    np.savez(tmp_path / "eval.npz", x=x[1500:], y=y[1500:])
    data = _load(tmp_path / "train.npz", tmp_path / "eval.npz")
    assert data.num_train == 1500 and len(data.held_out.y) == 297
    np.savez(tmp_path / "bad.npz", x=x[1500:, :10], y=y[1500:])
    with pytest.raises(DatasetError, match="do not match"):
        _load(tmp_path / "train.npz", tmp_path / "bad.npz")


def test_sharding_is_deterministic_and_disjoint(tmp_path):
    data = _load(digits_npz(tmp_path / "d.npz"))
    per_epoch = (data.num_train // 3) // 8
    seen = []
    for rank in range(3):
        rows = torch.cat([data.train_batch(step, rank, 3, 8, seed=5)[0] for step in range(per_epoch)])
        seen.append({tuple(r.tolist()) for r in rows})
        again = torch.cat([data.train_batch(step, rank, 3, 8, seed=5)[0] for step in range(per_epoch)])
        assert {tuple(r.tolist()) for r in again} == seen[-1]
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2])
    held = {tuple(r.tolist()) for r in data.held_out.x}
    assert not held & (seen[0] | seen[1] | seen[2])


@pytest.mark.parametrize("content,message", [
    ({"a": np.zeros(3)}, "expected tensors"),
    ({"x": np.zeros((3, 2)), "y": np.zeros(4, dtype=np.int64)}, "number of examples"),
    ({"tokens": np.zeros((2, 2), dtype=np.int64)}, "1-D integer"),
])
def test_malformed_tensor_files_are_refused(tmp_path, content, message):
    np.savez(tmp_path / "bad.npz", **content)
    with pytest.raises(DatasetError, match=message):
        _load(tmp_path / "bad.npz")


def test_npz_with_pickled_objects_is_refused(tmp_path):
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object), y=np.zeros(1, dtype=np.int64))
    with pytest.raises(DatasetError, match="pickle"):
        _load(tmp_path / "obj.npz")


def test_registry_model_on_a_file_dataset(tmp_path):
    path = digits_npz(tmp_path / "d.npz")
    spec = TrainSpec(model="digits-mlp", dataset="file", dataset_artifact=artifact_id(path), optimizer="sgd",
                     lr=0.1, steps=40, segment_steps=20, report_every=20)
    run = train_simulated(spec, 2, files=files_of(path))
    assert run.metrics[0]["accuracy"] > 60
    assert replace(spec, loss="cross_entropy").loss == "cross_entropy"


def test_an_npz_that_unpacks_past_the_limit_is_refused(tmp_path, monkeypatch):
    import ml.train.file_dataset as file_dataset
    np.savez_compressed(tmp_path / "bomb.npz", x=np.zeros((2000, 64), np.float32), y=np.zeros(2000, np.int64))
    monkeypatch.setattr(file_dataset, "MAX_UNPACKED_BYTES", 100_000)
    with pytest.raises(DatasetError, match="over the limit"):
        _load(tmp_path / "bomb.npz")

"""Registry: fixed splits, deterministic disjoint sharding, seeded models, clear errors on unknown names."""
import pytest
import torch

from ml.registry import UnknownName, build_model, get_dataset
from ml.registry.sharding import contiguous_shard, derive_seed, shard_indices
from ml.train.reproducibility import hash_state


def test_digits_split_is_fixed_and_disjoint():
    digits = get_dataset("digits")
    assert digits.x_train.shape[1] == 64 and len(digits.y_test) == 539
    assert len(digits.y_train) + len(digits.y_test) == 1797
    assert 0.0 <= float(digits.x_train.min()) and float(digits.x_train.max()) <= 1.0
    train_rows = {tuple(r.tolist()) for r in digits.x_train}
    overlap = sum(tuple(r.tolist()) in train_rows for r in digits.x_test)
    assert overlap < 5  # only the rare exact duplicate images of the original data set
    assert set(digits.y_test.tolist()) == set(range(10))


def test_shards_are_disjoint_cover_and_depend_on_seed_and_epoch():
    shards = [shard_indices(1000, r, 4, seed=7, epoch=3) for r in range(4)]
    joined = torch.cat(shards)
    assert sorted(joined.tolist()) == list(range(1000))
    assert torch.equal(shards[1], shard_indices(1000, 1, 4, seed=7, epoch=3))
    assert not torch.equal(shards[1], shard_indices(1000, 1, 4, seed=7, epoch=4))
    assert not torch.equal(shards[1], shard_indices(1000, 1, 4, seed=8, epoch=3))
    with pytest.raises(ValueError):
        shard_indices(10, 4, 4, seed=0, epoch=0)
    bounds = [contiguous_shard(10, r, 3) for r in range(3)]
    assert bounds == [(0, 3), (3, 6), (6, 10)]
    assert derive_seed("a", 1) == derive_seed("a", 1) != derive_seed("a", 2)


def test_digits_batches_are_deterministic_and_differ_between_workers():
    digits = get_dataset("digits")
    x0, y0 = digits.train_batch(step=5, rank=0, world=4, batch_size=32, seed=1)
    again, _ = digits.train_batch(step=5, rank=0, world=4, batch_size=32, seed=1)
    x1, _ = digits.train_batch(step=5, rank=1, world=4, batch_size=32, seed=1)
    assert x0.shape == (32, 64) and y0.shape == (32,)
    assert torch.equal(x0, again) and not torch.equal(x0, x1)


def test_shakespeare_corpus_split_and_batches():
    corpus = get_dataset("shakespeare")
    assert 60 <= corpus.vocab_size <= 100
    assert 4_000_000 < len(corpus.train_tokens) and 400_000 < len(corpus.valid_tokens)
    assert int(corpus.train_tokens.max()) < corpus.vocab_size
    x, y = corpus.train_batch(step=3, rank=2, world=4, batch_size=8, seed=0)
    assert x.shape == y.shape == (8, corpus.context)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one character
    x_again, _ = corpus.train_batch(step=3, rank=2, world=4, batch_size=8, seed=0)
    assert torch.equal(x, x_again)
    text = corpus.decode(x[0])
    assert len(text) == corpus.context and set(text) <= set(corpus.vocab)


def test_models_are_seeded_and_evaluate():
    digits = get_dataset("digits")
    a = build_model("digits-mlp", digits, seed=3)
    b = build_model("digits-mlp", digits, seed=3)
    c = build_model("digits-mlp", digits, seed=4)
    assert hash_state(a.state_dict()) == hash_state(b.state_dict()) != hash_state(c.state_dict())
    metrics = digits.evaluate(a)
    assert 0.0 <= metrics["accuracy"] <= 100.0 and metrics["loss"] > 0


def test_char_model_predicts_every_position_and_rejects_long_input():
    corpus = get_dataset("shakespeare")
    model = build_model("char-transformer", corpus, seed=0)
    x, _ = corpus.train_batch(step=0, rank=0, world=1, batch_size=2, seed=0)
    assert model(x).shape == (2, corpus.context, corpus.vocab_size)
    with pytest.raises(ValueError):
        model(torch.zeros(1, corpus.context + 1, dtype=torch.long))


def test_unknown_names_are_clear_errors():
    with pytest.raises(UnknownName, match="unknown dataset"):
        get_dataset("imagenet")
    with pytest.raises(UnknownName, match="unknown model"):
        build_model("gpt5", get_dataset("digits"), seed=0)

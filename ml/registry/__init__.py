"""Model and dataset registry: the names a training task may refer to, and how to build them.

`get_dataset(name)` returns a dataset object with `train_batch(step, rank, world, batch_size, seed)`,
`loss(outputs, targets)` and `evaluate(model)`; `build_model(name, dataset, seed)` builds the model
with seeded initial parameters, so every worker of a job starts from the same weights.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ml.global_rng import GENERATORS
from ml.registry.digits import DigitsDataset
from ml.registry.models import CharTransformer, DigitsMLP
from ml.registry.shakespeare import ShakespeareDataset

# a dataset is duck-typed (the interface in this docstring): Any, not a Protocol every dataset declares
DATASETS: dict[str, Callable[[], Any]] = {
    "digits": DigitsDataset,
    "shakespeare": ShakespeareDataset,
}

MODELS: dict[str, Callable[[Any], torch.nn.Module]] = {
    "digits-mlp": lambda dataset: DigitsMLP(dataset.num_features, (128, 64), dataset.num_classes),
    "char-transformer": lambda dataset: CharTransformer(dataset.vocab_size, dataset.context, width=64),
}

DEFAULT_MODEL = {"digits": "digits-mlp", "shakespeare": "char-transformer"}


class UnknownName(KeyError):
    """A model or dataset name that the registry does not hold."""


@functools.cache
def get_dataset(name: str):
    """The (shared, read-only) dataset registered under `name`."""
    try:
        factory = DATASETS[name]
    except KeyError:
        raise UnknownName(f"unknown dataset {name!r}; known: {sorted(DATASETS)}") from None
    return factory()


def build_model(name: str, dataset, seed: int) -> torch.nn.Module:
    """A fresh model registered under `name`, its initial parameters a function of `seed` only."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise UnknownName(f"unknown model {name!r}; known: {sorted(MODELS)}") from None
    with GENERATORS, torch.random.fork_rng(devices=[]):   # no other thread reseeds it meanwhile (ADR 0196)
        torch.manual_seed(seed)
        return factory(dataset)


__all__ = ["DATASETS", "MODELS", "DEFAULT_MODEL", "UnknownName", "get_dataset", "build_model",
           "DigitsDataset", "ShakespeareDataset", "DigitsMLP", "CharTransformer"]

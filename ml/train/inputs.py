"""A task's inputs: the model, dataset and loss a TrainSpec names, built from the registry or from the
artifact files the worker fetched (`files`: artifact id -> local path).

Registry models and datasets are built as before; a `pt2` model is loaded from its torch.export archive
without running code it carries (ml/train/model_archive.py), a `file` dataset from its file
(ml/train/file_dataset.py), each first loaded in a child process with CPU and memory limits
(ml/train/sandbox.py, once per file). With `init == "seed"` the archive's parameters are replaced by values drawn
from the spec's seed (`reinitialise`), so every worker starts from the same weights.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ml.names import ARCHIVE_MODEL, FILE_DATASET
from ml.registry import build_model, get_dataset
from ml.registry.sharding import generator
from ml.train.file_dataset import load_file_dataset
from ml.train.losses import get_loss
from ml.train.model_archive import input_shape, load_archive, trainable_module
from ml.train.op_randomness import eval_randomness, evaluating
from ml.train.sandbox import check_archive, check_dataset
from ml.train.spec import TrainSpec

DEFAULT_CONTEXT = 64


class MissingInput(ValueError):
    """An artifact the spec needs is not among the local files."""


@dataclass
class TaskInputs:
    dataset: Any             # a registry dataset or a FileDataset: train_batch, loss, evaluate
    model: torch.nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[], dict[str, float]]


def artifact_ids(spec: TrainSpec) -> list[str]:
    """The artifact ids `spec` needs (model archive, dataset, held-out data), without repeats."""
    ids = [spec.model_artifact, spec.dataset_artifact, spec.eval_artifact]
    return list(dict.fromkeys(i for i in ids if i))


def artifact_path(files: Mapping[str, Path] | None, artifact_id: str, what: str) -> Path:
    try:
        return Path((files or {})[artifact_id])
    except KeyError:
        raise MissingInput(f"the task's {what} (artifact {artifact_id[:16]}...) is not among the local "
                           "files") from None


def reinitialise(model: torch.nn.Module, seed: int) -> None:
    """Fresh parameters drawn from `seed`, each from its own stream named by the parameter's name:
    tensors of 2+ dims uniform in +-1/sqrt(fan_in) (torch's Linear/Conv default), 1-D `*weight` (norm
    scales) ones, other 1-D tensors (biases) zeros. Buffers are kept."""
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                fan_in = param[0].numel()
                bound = 1.0 / fan_in ** 0.5
                values = torch.rand(param.shape, generator=generator("init", seed, name), dtype=torch.float64)
                param.copy_(((values * 2 - 1) * bound).to(param.dtype))
            elif name.rsplit(".", 1)[-1] == "weight":
                param.fill_(1.0)
            else:
                param.zero_()


def _device(spec: TrainSpec) -> str:
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the task asks for a CUDA device and this machine has none")
    return spec.device


def build_inputs(spec: TrainSpec, files: Mapping[str, Path] | None = None) -> TaskInputs:
    """Dataset, model (on spec.device, initial weights set), loss and evaluation of `spec` (blocking)."""
    device = _device(spec)
    program = None
    if spec.model == ARCHIVE_MODEL:
        path = artifact_path(files, spec.model_artifact, "model")
        check_archive(path, spec.model_artifact)
        program = load_archive(path)
    if spec.dataset == FILE_DATASET:
        context = DEFAULT_CONTEXT
        shape = input_shape(program) if program is not None else []
        if len(shape) == 2 and isinstance(shape[1], int):
            context = shape[1]
        eval_path = str(artifact_path(files, spec.eval_artifact, "held-out data")) if spec.eval_artifact else ""
        train_path = str(artifact_path(files, spec.dataset_artifact, "dataset"))
        check_dataset(train_path, eval_path, spec.tokenizer, context, (spec.dataset_artifact, spec.eval_artifact))
        dataset = load_file_dataset(train_path, eval_path, spec.tokenizer, context)
    else:
        dataset = get_dataset(spec.dataset)
    if program is not None:
        model = trainable_module(program, device)
        if spec.init == "seed":
            reinitialise(model, spec.seed)
    else:
        model = build_model(spec.model, dataset, spec.seed).to(device)
    loss = get_loss(spec.loss) if spec.loss else dataset.loss
    if spec.dataset == FILE_DATASET:
        evaluate = functools.partial(dataset.evaluate, model, device, loss)
    else:
        evaluate = functools.partial(dataset.evaluate, model, device=device)
    return TaskInputs(dataset, model, loss, functools.partial(_without_randomness, evaluate, spec.seed, device))


def _without_randomness(evaluate: Callable[[], dict[str, float]], seed: int, device: str) -> dict[str, float]:
    """Held-out metrics with dropout and the like off and any other random operator seeded
    (ml/train/op_randomness.py)."""
    with evaluating(), eval_randomness(seed, device):
        return evaluate()

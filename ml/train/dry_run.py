"""Dry run of a training spec: build its inputs and take one optimizer step locally (blocking), so an
untrainable task (a pickle instead of an archive, an operator off the allow-list, mismatched shapes
or dtypes, a token model whose vocabulary is smaller than the dataset's, a NaN loss, a missing file)
is reported before anything is paid or a worker commits.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from ml.train.file_dataset import DatasetError, file_format, load_file_dataset
from ml.train.inputs import MissingInput, build_inputs
from ml.train.model_archive import ArchiveRefused
from ml.train.op_randomness import step_randomness
from ml.train.spec import TrainSpec
from ml.train.worker import make_optimizer


class Untrainable(ValueError):
    """The spec cannot be trained; `reason` says why in a sentence."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def dry_run(spec: TrainSpec, files: Mapping[str, Path] | None = None, world: int = 1) -> dict:
    """One step of `spec` as worker 0 of `world`: {"loss", "params", "step_seconds", "metrics"} (metrics:
    the held-out evaluation of the initial model); raises Untrainable."""
    try:
        inputs = build_inputs(spec, files)
    except (ArchiveRefused, DatasetError, MissingInput) as exc:
        raise Untrainable(str(exc)) from None
    except RuntimeError as exc:
        raise Untrainable(f"cannot build the model: {exc}") from None
    dataset, model = inputs.dataset, inputs.model
    if hasattr(dataset, "check_world"):
        try:
            dataset.check_world(world)
        except DatasetError as exc:
            raise Untrainable(str(exc)) from None
    check_outputs = None
    if getattr(dataset, "kind", "") == "tokens":
        check_vocabulary(spec, files, dataset.vocab_size, embedding_rows(model))
        check_outputs = functools.partial(check_vocabulary, spec, files, dataset.vocab_size, part="output")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise Untrainable("the model has no trainable parameters")
    optimizer = make_optimizer(spec, params)
    x, y = dataset.train_batch(0, 0, world, spec.batch_size, spec.seed)
    started = time.perf_counter()
    with step_randomness(spec.seed, 0, 0, spec.device):   # the seeded draws of the workers' first step
        loss = _forward_backward(model, inputs.loss, x.to(spec.device), y.to(spec.device), spec.device, check_outputs)
    value = float(loss.detach())
    if not math.isfinite(value):
        raise Untrainable(f"the loss is {value} at the first step")
    step_seconds = time.perf_counter() - started
    try:  # before the optimizer step: the initial model's metrics
        metrics = inputs.evaluate()
    except Exception as exc:  # the same failures as a training step, on the held-out data
        raise Untrainable(f"the model cannot be evaluated on the held-out data: {_first_line(exc)}") from None
    started = time.perf_counter()
    optimizer.step()
    step_seconds += time.perf_counter() - started
    if any(not torch.isfinite(p).all() for p in params):
        raise Untrainable("the parameters are not finite after the first step")
    return {"loss": value, "params": sum(p.numel() for p in params),
            "step_seconds": step_seconds, "metrics": metrics}


def _forward_backward(model: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor,
                      device: str, check_outputs: Callable[[int], None] | None) -> torch.Tensor:
    try:
        out = model(x)
    except Exception as exc:  # torch raises RuntimeError, ValueError, AssertionError, ... on bad inputs
        raise Untrainable(f"the model cannot run on the dataset's batches (inputs {x.dtype} "
                          f"{tuple(x.shape)}): {_first_line(exc)}") from None
    if not isinstance(out, torch.Tensor):
        raise Untrainable(f"the model returns {type(out).__name__}, not one tensor")
    if check_outputs is not None and out.dim() >= 1:
        check_outputs(int(out.shape[-1]))
    try:
        loss = loss_fn(out, y)
    except Exception as exc:
        raise Untrainable(f"the loss cannot use the model's outputs {out.dtype} {tuple(out.shape)} with "
                          f"targets {y.dtype} {tuple(y.shape)}: {_first_line(exc)}") from None
    try:
        loss.backward()
    except Exception as exc:  # e.g. an operator with no deterministic backward on this device
        raise Untrainable(f"the backward pass fails on {device}: {_first_line(exc)}") from None
    return loss


# operators an exported graph passes token ids through before its embedding looks them up
_PASS_THROUGH = frozenset({"view", "reshape", "_unsafe_view", "_to_copy", "to", "clone", "contiguous", "unsqueeze",
                           "squeeze", "flatten", "alias", "detach", "slice", "select", "expand", "lift_fresh_copy"})
_LOOKUPS = frozenset({"embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"})


def embedding_rows(model: torch.nn.Module) -> int | None:
    """The number of rows of the smallest embedding table that a graph module's first input indexes
    (following reshapes and copies of the input), or None when it has none."""
    graph = getattr(model, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return None
    seen, frontier, rows = {placeholders[0]}, [placeholders[0]], []
    while frontier:
        node = frontier.pop()
        for user in node.users:
            target = user.target
            name = target._schema.name.split("::")[-1] if isinstance(target, torch._ops.OpOverload) else ""
            if name in _LOOKUPS and len(user.args) > 1 and user.args[1] is node:
                table = user.args[0]
                weight = _attribute(model, str(table.target)) if isinstance(table, torch.fx.Node) \
                    and table.op == "get_attr" else None
                if weight is not None and weight.dim() == 2:
                    rows.append(int(weight.shape[0]))
            elif name in _PASS_THROUGH and user not in seen:
                seen.add(user)
                frontier.append(user)
    return min(rows) if rows else None


def _attribute(module: torch.nn.Module, path: str) -> torch.Tensor | None:
    value: object = module
    for part in path.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def check_vocabulary(spec: TrainSpec, files: Mapping[str, Path] | None, vocab: int, size: int | None,
                     part: str = "embedding") -> None:
    """Untrainable when the model's `part` ("embedding": its rows; "output": its logits per position)
    is smaller than the dataset's vocabulary, saying what to change (the tokenizer of a text file, or
    the model's size)."""
    if size is None or size >= vocab:
        return
    has = f"embedding has {size} rows" if part == "embedding" else f"output layer gives {size} logits per position"
    grow = f"enlarge the {'embedding' if part == 'embedding' else 'output layer'} to {vocab}"
    reason = f"your model's {has}, the dataset has {vocab} tokens"
    characters = _char_vocabulary(spec, files) if spec.tokenizer == "byte" else None
    if characters is not None and characters <= size:
        raise Untrainable(f"{reason}: use --tokenizer char (the text has {characters} distinct characters) or {grow}")
    if spec.tokenizer == "char" and spec.dataset_artifact:
        raise Untrainable(f"{reason} (the training text's distinct characters, --tokenizer char): {grow}")
    raise Untrainable(f"{reason}: {grow}" + (f" (--tokenizer char would need {characters})" if characters else ""))


def _char_vocabulary(spec: TrainSpec, files: Mapping[str, Path] | None) -> int | None:
    """How many distinct characters the training text has (None when the dataset is not UTF-8 text)."""
    path = Path((files or {}).get(spec.dataset_artifact, "")) if spec.dataset_artifact else None
    if path is None or not path.is_file() or file_format(path) != "text":
        return None
    try:
        return load_file_dataset(str(path), "", "char", 1).vocab_size
    except DatasetError:
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]

"""Dry run of a training spec: build its inputs and take one optimizer step locally (blocking), so an
untrainable task (a pickle instead of an archive, an operator off the allow-list, mismatched shapes
or dtypes, a NaN loss, a missing file) is reported before anything is paid or a worker commits.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from ml.train.file_dataset import DatasetError
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
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise Untrainable("the model has no trainable parameters")
    optimizer = make_optimizer(spec, params)
    x, y = dataset.train_batch(0, 0, world, spec.batch_size, spec.seed)
    started = time.perf_counter()
    with step_randomness(spec.seed, 0, 0, spec.device):   # the seeded draws of the workers' first step
        loss = _forward_backward(model, inputs.loss, x.to(spec.device), y.to(spec.device), spec.device)
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
                      device: str) -> torch.Tensor:
    try:
        out = model(x)
    except Exception as exc:  # torch raises RuntimeError, ValueError, AssertionError, ... on bad inputs
        raise Untrainable(f"the model cannot run on the dataset's batches (inputs {x.dtype} "
                          f"{tuple(x.shape)}): {_first_line(exc)}") from None
    if not isinstance(out, torch.Tensor):
        raise Untrainable(f"the model returns {type(out).__name__}, not one tensor")
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]

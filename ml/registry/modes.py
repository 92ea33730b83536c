"""Evaluation mode for any model a task trains, registry module or torch.export graph."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """`model` in eval mode for the block (a torch.export graph module, which has no train/eval
    switch, is left as it is)."""
    was_training = model.training
    try:
        model.eval()
    except NotImplementedError:
        yield
        return
    try:
        yield
    finally:
        model.train(was_training)

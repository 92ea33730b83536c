"""Evaluation mode for any model a task trains, registry module or torch.export graph."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
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

"""The losses a task may name (a fixed set: a worker runs no code it received).

Each checks the shapes it is given and raises ValueError saying what it expected, which the dry run
reports before anything is paid.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ml.names import LOSS_NAMES


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Classification: logits (batch, classes), integer class labels (batch,)."""
    if outputs.dim() != 2 or targets.dim() != 1 or outputs.shape[0] != targets.shape[0]:
        raise ValueError(f"cross_entropy expects logits (batch, classes) and labels (batch,), got "
                         f"{tuple(outputs.shape)} and {tuple(targets.shape)}")
    return F.cross_entropy(outputs, targets)


def next_token_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Language modelling: logits (batch, length, vocab), next-token ids (batch, length)."""
    if outputs.dim() != 3 or tuple(targets.shape) != tuple(outputs.shape[:2]):
        raise ValueError(f"next_token_cross_entropy expects logits (batch, length, vocab) and targets "
                         f"(batch, length), got {tuple(outputs.shape)} and {tuple(targets.shape)}")
    return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))


def mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Regression: outputs and float targets of one shape ((batch,) targets also match (batch, 1))."""
    if outputs.dim() == targets.dim() + 1 and outputs.shape[-1] == 1:
        outputs = outputs.squeeze(-1)
    if tuple(outputs.shape) != tuple(targets.shape):
        raise ValueError(f"mse expects outputs and targets of one shape, got {tuple(outputs.shape)} and "
                         f"{tuple(targets.shape)}")
    return F.mse_loss(outputs, targets)


LOSSES = {"cross_entropy": cross_entropy, "mse": mse, "next_token_cross_entropy": next_token_cross_entropy}


def get_loss(name: str):
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {list(LOSS_NAMES)}") from None

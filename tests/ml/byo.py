"""Bring-your-own model and data for the tests: a small CNN over scikit-learn's 8x8 digits exported
to a .pt2 archive, and dataset files in each supported format."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class DigitsCNN(nn.Module):
    """(batch, 64) pixels in [0, 1] -> (batch, 10) logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv(x.view(-1, 1, 8, 8))), 2)
        return self.fc(x.flatten(1))


class TinyLM(nn.Module):
    """(batch, 16) token ids -> (batch, 16, 256) next-token logits."""

    def __init__(self, vocab: int = 256, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


def export(model: nn.Module, example: torch.Tensor, path: Path, dynamic_batch: bool = True) -> Path:
    torch.manual_seed(0)
    shapes = ({0: torch.export.Dim("batch", min=1, max=65536)},) if dynamic_batch else None
    torch.export.save(torch.export.export(model, (example,), dynamic_shapes=shapes), str(path))
    return path


def digits_cnn_archive(path: Path) -> Path:
    torch.manual_seed(1)
    return export(DigitsCNN(), torch.rand(4, 64), path)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    bunch = load_digits()
    return (bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int64)


def digits_npz(path: Path, keys: tuple[str, str] = ("x", "y")) -> Path:
    x, y = digits_arrays()
    with open(path, "wb") as f:
        np.savez(f, **{keys[0]: x, keys[1]: y})
    return path


def artifact_id(path: Path) -> str:
    """Stand-in for the artifact id (any 64-hex content hash works for the ml layer)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(*paths: Path) -> dict[str, Path]:
    return {artifact_id(p): p for p in paths}

"""scikit-learn's 8x8 handwritten digits as a registry dataset: fixed train/test split, sharded batches.

The data ships inside scikit-learn (no download). Pixels are scaled to [0, 1]; the split is a fixed
seeded permutation, so every node sees the same train and test sets.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ml.registry.modes import eval_mode
from ml.registry.sharding import generator, shard_indices

SPLIT_SEED = "digits-split-v1"
TEST_FRACTION = 0.3


@functools.lru_cache(maxsize=1)
def _load_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=generator(SPLIT_SEED))
    n_test = int(round(len(y) * TEST_FRACTION))
    test, train = order[:n_test], order[n_test:]
    return x[train].contiguous(), y[train].contiguous(), x[test].contiguous(), y[test].contiguous()


class DigitsDataset:
    """Classification of 8x8 digit images (64 features, 10 classes)."""

    name = "digits"
    num_features = 64
    num_classes = 10

    def __init__(self) -> None:
        self.x_train, self.y_train, self.x_test, self.y_test = _load_split()

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    def steps_per_epoch(self, world: int, batch_size: int) -> int:
        return max(1, (self.num_train // world) // batch_size)

    def train_batch(self, step: int, rank: int, world: int, batch_size: int,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch worker `rank` trains on at `step`: a slice of its shard of the epoch's permutation."""
        per_epoch = self.steps_per_epoch(world, batch_size)
        epoch, index = divmod(step, per_epoch)
        shard = shard_indices(self.num_train, rank, world, seed, epoch)
        picked = shard[index * batch_size:(index + 1) * batch_size]
        return self.x_train[picked], self.y_train[picked]

    @staticmethod
    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: str = "cpu") -> dict[str, float]:
        """Test-set accuracy (percent) and mean cross-entropy."""
        with eval_mode(model):
            logits = model(self.x_test.to(device))
        y_test = self.y_test.to(device)
        correct = int((logits.argmax(dim=1) == y_test).sum())
        return {
            "accuracy": 100.0 * correct / len(self.y_test),
            "loss": float(F.cross_entropy(logits, y_test)),
        }

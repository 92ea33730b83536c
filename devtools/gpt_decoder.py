"""A GPT-style decoder as a user writes it (issue 23 item 5), and its `.pt2` archive exported the way
the conformance suite's users export theirs (tests/models/test_conformance.py: torch.export with a
dynamic batch dimension).

`GPT(config)`: token and learned position embeddings, `layers` pre-norm blocks (LayerNorm, causal
self-attention through F.scaled_dot_product_attention, LayerNorm, a 4x GELU MLP), a final LayerNorm
and an untied linear head: (batch, context) token ids -> (batch, context, vocab) next-token logits.
`BIG` is the ~100M configuration (12 layers, width 768, 12 heads, a vocabulary of 8192, context
256: 97.9M parameters); `TINY` is the same code at CI size. The parameters are named
`blocks.<i>.…`, so streaming DiLoCo's schedule strides the blocks over its fragments (ADR 0191).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab: int
    context: int
    layers: int
    width: int
    heads: int

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")


BIG = GPTConfig(vocab=8192, context=256, layers=12, width=768, heads=12)
TINY = GPTConfig(vocab=64, context=16, layers=2, width=32, heads=4)


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        self.norm2 = nn.LayerNorm(config.width)
        self.up = nn.Linear(config.width, 4 * config.width)
        self.down = nn.Linear(4 * config.width, config.width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, c = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return h + self.down(F.gelu(self.up(self.norm2(h))))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.width)
        self.pos = nn.Parameter(torch.zeros(config.context, config.width))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)
        for name, p in self.named_parameters():   # GPT-2's initialisation scale
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def export_archive(config: GPTConfig, path: Path, seed: int = 0) -> GPT:
    """The user's model (seeded) and its archive at `path`, exported with a dynamic batch dimension."""
    torch.manual_seed(seed)
    model = GPT(config)
    example = torch.randint(0, config.vocab, (2, config.context))
    batch = torch.export.Dim("batch", min=1, max=65536)
    torch.export.save(torch.export.export(model, (example,), dynamic_shapes=({0: batch},)), str(path))
    return model

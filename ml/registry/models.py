"""Registry models: an MLP for digits and a small causal char-level transformer for Shakespeare.

No dropout or other hidden randomness: a forward/backward pass is a pure function of parameters and
batch, which keeps CPU training bit-reproducible; each class says so (`draws_randomness = False`), so
their training steps run without holding torch's generators (docs/adr/0196).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class DigitsMLP(nn.Module):
    """64 -> hidden -> ... -> 10 with ReLU."""

    draws_randomness = False   # its steps need no seeded generator (ml.train.op_randomness.draws_randomness)

    def __init__(self, inputs: int = 64, hidden: tuple[int, ...] = (128, 64), classes: int = 10):
        super().__init__()
        widths = (inputs, *hidden)
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(widths, widths[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class TransformerBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    """Decoder-only transformer over characters: (batch, length) token ids -> (batch, length, vocab)."""

    draws_randomness = False

    def __init__(self, vocab_size: int, context: int = 128, width: int = 128, layers: int = 2,
                 heads: int = 4):
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        nn.init.normal_(self.position, std=0.02)
        self.blocks = nn.ModuleList(TransformerBlock(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.context:
            raise ValueError(f"sequence of {length} exceeds the model's context of {self.context}")
        x = self.embed(tokens) + self.position[:length]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

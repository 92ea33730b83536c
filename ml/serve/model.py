"""A GPT-style decoder that can be split by blocks and run step by step with a KV cache.

The parameters carry the names of the registry's `CharTransformer` (embed, position, blocks.<i>.*,
norm, head), so a state dict the network trained loads as is. A party builds only what it runs:
a server the blocks of its range (`block_range=(a, b)`), a client only the ends (embeddings, final
norm and head: `block_range=(0, 0)`). `random_decoder` builds a larger configuration whose weights
are a function of (config, seed, block index) only, so a server building blocks 4..8 gets exactly
the weights the whole model has there.

Every computation on hidden states goes through `DecoderBlock.step`, the same code for a server,
a local reference run and a replay, so in one profile the same chunks give bit-identical results.
A part is built on the CPU (its weights do not depend on the device) and may then be moved with
`.to(device)`: its KV caches and computations follow its weights (`device`). Bit-identical results
need the same torch settings in every party's computing thread: `pin_numerics` (called by
`run_blocks`) fixes the intra-op thread count, a reduction split over another number of threads
rounding differently (ADR 0178).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ml.profiles import configure_portable_torch
from ml.registry import models as registry

SERVE_THREADS = 1   # torch intra-op threads of every block computation (ADR 0178): any machine can match it


def pin_numerics() -> None:
    """Put this OS thread's torch in the settings every party's block computations share (ADR 0178):
    SERVE_THREADS intra-op threads (torch sets the count per OS thread, and a new thread inherits
    whatever the process last set: the machine's core count, OMP_NUM_THREADS, or a training job's),
    and in the portable CPU profile oneDNN off (ml.profiles.configure_portable_torch). A server, a
    client's spot check and a referee otherwise disagree on an honest answer."""
    if torch.get_num_threads() != SERVE_THREADS:
        torch.set_num_threads(SERVE_THREADS)
    configure_portable_torch(torch)


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    context: int = 128
    width: int = 64
    layers: int = 2
    heads: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "width", "layers", "heads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by {self.heads} heads")

    def block_params(self) -> int:
        """Parameters in one block (for FLOP counts)."""
        w = self.width
        return 2 * 2 * w + (3 * w * w + 3 * w) + (w * w + w) + (4 * w * w + 4 * w) + (4 * w * w + w)

    def model_id(self, seed: int | None = None) -> str:
        """A short name for this configuration (and seed, for randomly initialised weights)."""
        text = repr(sorted(asdict(self).items())) + ("" if seed is None else f"/seed={seed}")
        return hashlib.sha256(text.encode()).hexdigest()[:16]


LARGE = {"width": 768, "layers": 12, "heads": 12, "context": 512, "vocab_size": 256}


class KVCache:
    """Keys and values of one block for one session, preallocated to `max_length` positions."""

    def __init__(self, batch: int, heads: int, head_dim: int, max_length: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.keys = torch.zeros(batch, heads, max_length, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros(batch, heads, max_length, head_dim, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_length(self) -> int:
        return self.keys.shape[2]

    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = k.shape[2]
        if self.length + new > self.max_length:
            raise ValueError(f"session of {self.max_length} positions cannot take {new} more after {self.length}")
        self.keys[:, :, self.length:self.length + new] = k
        self.values[:, :, self.length:self.length + new] = v
        self.length += new
        return self.keys[:, :, :self.length], self.values[:, :, :self.length]


def cache_bytes(config: DecoderConfig, blocks: int, batch: int, max_length: int) -> int:
    """The memory a session's KV caches take on a server holding `blocks` blocks."""
    return 2 * blocks * batch * max_length * config.width * 4


class CausalSelfAttention(registry.CausalSelfAttention):
    """The registry attention (same parameters) with a KV cache and a LoRA hook."""

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                lora: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        batch, length, width = x.shape
        qkv = self.qkv(x)
        if lora is not None:    # low-rank adapter on the qkv projection: + B (A x)
            qkv = qkv + (x @ lora[0].transpose(0, 1)) @ lora[1].transpose(0, 1)
        q, k, v = qkv.split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        if length == 1:
            y = F.scaled_dot_product_attention(q, k, v)   # one query sees the whole past
        elif past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(length, past + length, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(batch, length, width))
        return out


class DecoderBlock(registry.TransformerBlock):
    """The registry block (same parameter names: a trained char-transformer loads unchanged) whose
    attention keeps a KV cache."""

    def __init__(self, width: int, heads: int):
        super().__init__(width, heads)
        self.attn = CausalSelfAttention(width, heads)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                lora: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cache, lora)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class ServeDecoder(nn.Module):
    """The parts of a decoder one party runs: blocks `block_range` and, if `ends`, the embeddings,
    final norm and head."""

    def __init__(self, config: DecoderConfig, block_range: tuple[int, int] | None = None, ends: bool = True):
        super().__init__()
        start, end = block_range if block_range is not None else (0, config.layers)
        if not 0 <= start <= end <= config.layers:
            raise ValueError(f"block range {start}:{end} outside the model's {config.layers} blocks")
        self.config, self.start, self.end, self.has_ends = config, start, end, ends
        if ends:
            self.embed = nn.Embedding(config.vocab_size, config.width)
            self.position = nn.Parameter(torch.zeros(config.context, config.width))
            self.norm = nn.LayerNorm(config.width)
            self.head = nn.Linear(config.width, config.vocab_size)
        self.blocks = nn.ModuleDict({str(i): DecoderBlock(config.width, config.heads) for i in range(start, end)})

    @property
    def device(self) -> torch.device:
        """Where this part's weights are (and so its KV caches and computations)."""
        return next((p.device for p in self.parameters()), torch.device("cpu"))

    # ---- the client's ends
    def embed_tokens(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """The hidden states of `tokens` (on any device) at positions offset.., on this part's device."""
        length = tokens.shape[1]
        if offset + length > self.config.context:
            raise ValueError(f"position {offset + length} exceeds the model's context of {self.config.context}")
        hidden: torch.Tensor = self.embed(tokens.to(self.position.device)) + self.position[offset:offset + length]
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.norm(hidden))
        return logits

    # ---- blocks
    def new_caches(self, batch: int, max_length: int) -> list[KVCache]:
        head_dim = self.config.width // self.config.heads
        return [KVCache(batch, self.config.heads, head_dim, max_length, device=self.device)
                for _ in range(self.start, self.end)]

    def run_blocks(self, hidden: torch.Tensor, caches: list[KVCache] | None = None,
                   prompts: torch.Tensor | None = None,
                   lora: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Blocks start..end over `hidden` (batch, length, width). With `caches`, a step of an
        inference session; with `prompts` (blocks, batch, P, width), deep prompt tuning: prompt i
        is added to the first P positions before block i; with `lora` = (A (blocks, r, width),
        B (blocks, 3 width, r)), block i's qkv projection gets + B[i] A[i] x. Blocking: torch, with this
        thread's numerics pinned (pin_numerics)."""
        pin_numerics()
        for index, block in enumerate(self.blocks.values()):
            if prompts is not None:
                hidden = torch.cat([hidden[:, :prompts.shape[2]] + prompts[index], hidden[:, prompts.shape[2]:]], 1)
            adapter = None if lora is None else (lora[0][index], lora[1][index])
            hidden = block(hidden, None if caches is None else caches[index], adapter)
        return hidden

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Whole-sequence logits (requires all blocks and the ends)."""
        if not self.has_ends or (self.start, self.end) != (0, self.config.layers):
            raise ValueError("a full forward needs the ends and every block")
        return self.logits(self.run_blocks(self.embed_tokens(tokens)))

    # ---- weights
    def load_parts(self, state: dict[str, torch.Tensor]) -> None:
        """Load the entries of a full-model state dict that this part holds (all of them must be there)."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        if missing:
            raise ValueError(f"state dict lacks {missing[:3]}")
        for key, tensor in own.items():
            if tuple(state[key].shape) != tuple(tensor.shape):
                raise ValueError(f"{key}: shape {tuple(state[key].shape)} != {tuple(tensor.shape)}")
        self.load_state_dict({k: state[k] for k in own}, strict=True)


def config_from_state(state: dict[str, torch.Tensor], heads: int = 4) -> DecoderConfig:
    """The configuration of a `CharTransformer` state dict (heads are not in the weights)."""
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    context, width = state["position"].shape
    return DecoderConfig(vocab_size=state["embed.weight"].shape[0], context=context, width=width,
                         layers=layers, heads=heads)


def random_decoder(config: DecoderConfig, seed: int, block_range: tuple[int, int] | None = None,
                   ends: bool = True) -> ServeDecoder:
    """A decoder with GPT-2-style random weights, each part a function of (seed, part) only."""
    model = ServeDecoder(config, block_range, ends)

    def fill(module: nn.Module, part: int) -> None:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + part)
        with torch.no_grad():
            for name, param in module.named_parameters():
                if name.endswith("bias"):
                    param.zero_()
                elif "norm" in name:
                    param.fill_(1.0)
                else:
                    std = 0.02
                    if name.endswith(("out.weight", "mlp.2.weight")):
                        std = 0.02 / math.sqrt(2 * config.layers)
                    elif name == "head.weight":   # logits of unit scale at any width
                        std = 1.0 / math.sqrt(config.width)
                    param.normal_(0.0, std, generator=gen)

    if ends:
        ends_module = nn.ModuleDict({"embed": model.embed, "norm": model.norm, "head": model.head})
        fill(ends_module, 0)
        with torch.no_grad():
            model.position.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(seed * 1_000_003 + 1))
    for index, block in model.blocks.items():
        fill(block, 2 + int(index))
    return model

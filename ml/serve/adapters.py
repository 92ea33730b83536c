"""Parameters a serving client owns and the servers apply on its behalf: LoRA adapters on every
block's qkv projection and prompts (an input soft prompt plus deep prompts added to the first P
positions before every block).

`ClientParams` slices them per span (`for_span`), builds the soft-prompt prefix (`prefix`), and reads
and writes them as safetensors (`load` / `save`, keys lora_a, lora_b, input_prompt, deep_prompts),
checking every shape against the model's configuration.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ml.serve.model import DecoderConfig, ServeDecoder

KEYS = ("lora_a", "lora_b", "input_prompt", "deep_prompts")


class AdapterError(ValueError):
    """Parameters whose shapes do not fit the model, or a file that holds none."""


@dataclass(frozen=True)
class ClientParams:
    lora_a: torch.Tensor | None = None         # (layers, r, width)
    lora_b: torch.Tensor | None = None         # (layers, 3 width, r)
    input_prompt: torch.Tensor | None = None   # (P, width)
    deep_prompts: torch.Tensor | None = None   # (layers, P, width)

    @property
    def prompt_length(self) -> int:
        return 0 if self.input_prompt is None else self.input_prompt.shape[0]

    def check(self, config: DecoderConfig) -> ClientParams:
        layers, width = config.layers, config.width
        if (self.lora_a is None) != (self.lora_b is None) or (self.input_prompt is None) != (self.deep_prompts is None):
            raise AdapterError("need lora_a with lora_b, and input_prompt with deep_prompts")
        if self.lora_a is not None and self.lora_b is not None:
            a, b = self.lora_a, self.lora_b
            if (a.dim() != 3 or b.dim() != 3 or a.shape[0] != layers or b.shape[0] != layers or a.shape[2] != width
                    or b.shape[1] != 3 * width or a.shape[1] != b.shape[2]):
                raise AdapterError(f"lora must be A ({layers}, r, {width}) and B ({layers}, {3 * width}, r)")
        if self.input_prompt is not None and self.deep_prompts is not None:
            p, d = self.input_prompt, self.deep_prompts
            if (p.dim() != 2 or p.shape[1] != width or d.dim() != 3 or d.shape[0] != layers
                    or d.shape[1:] != p.shape or not 1 <= p.shape[0] < config.context):
                raise AdapterError(f"prompts must be input (P, {width}) and deep ({layers}, P, {width})")
        return self

    def for_span(self, start: int, end: int,
                 batch: int = 1) -> tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor] | None]:
        """(deep prompts (blocks, batch, P, width) | None, LoRA (A, B) | None) for blocks start..end."""
        deep = None
        if self.deep_prompts is not None:
            deep = self.deep_prompts[start:end].unsqueeze(1).expand(-1, batch, -1, -1).contiguous()
        lora = None if self.lora_a is None or self.lora_b is None else (self.lora_a[start:end], self.lora_b[start:end])
        return deep, lora

    def prefix(self, ends: ServeDecoder, batch: int = 1) -> torch.Tensor | None:
        """The soft prompt's hidden states (batch, P, width) that precede the tokens (on the ends'
        device), or None."""
        if self.input_prompt is None:
            return None
        position = ends.position[:self.prompt_length]
        return (self.input_prompt.to(position.device) + position).expand(batch, -1, -1)

    def save(self, path: Path, metadata: dict[str, str] | None = None) -> None:
        from safetensors.torch import save_file

        tensors = {k: getattr(self, k).detach().contiguous() for k in KEYS if getattr(self, k) is not None}
        save_file(tensors, str(path), metadata)

    @classmethod
    def load(cls, path: Path, config: DecoderConfig) -> ClientParams:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise AdapterError(f"cannot read {path}: {exc}") from None
        if not any(k in tensors for k in KEYS):
            raise AdapterError(f"{path} holds none of {list(KEYS)}")
        return cls(**{k: tensors.get(k) for k in KEYS}).check(config)

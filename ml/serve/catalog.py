"""Which model a serving command means, and how its text becomes tokens.

A model spec is either `random:<layers>x<width>[:<heads>][@<seed>]` (random weights that every
party rebuilds identically, vocabulary = bytes; `random:large` is 12x768 with 12 heads) or the
path of a safetensors file holding a registry `char-transformer` state dict (vocabulary = the
Shakespeare dataset's characters, text outside it is refused). `load_part` builds just the part a
party runs; the model id names weights and configuration together.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ml.serve.model import LARGE, DecoderConfig, ServeDecoder, config_from_state, random_decoder

RANDOM = re.compile(r"^random:(?:(large)|(\d{1,3})x(\d{1,5})(?::(\d{1,3}))?)(?:@(\d{1,9}))?$")


class ModelSpecError(ValueError):
    """A model spec that names no model this node can build."""


@dataclass(frozen=True)
class ModelSpec:
    text: str
    config: DecoderConfig
    model_id: str
    seed: int | None = None
    path: Path | None = None

    def load_part(self, block_range: tuple[int, int] | None, ends: bool, device: str = "cpu") -> ServeDecoder:
        """Blocks `block_range` (None: all) and, if `ends`, the ends, built on the CPU and moved to
        `device` (blocking)."""
        if self.path is None:
            return random_decoder(self.config, self.seed or 0, block_range, ends).to(device)
        from safetensors.torch import load_file

        model = ServeDecoder(self.config, block_range, ends)
        model.load_parts(load_file(str(self.path)))
        return model.to(device)

    def encode(self, text: str) -> list[int]:
        if self.path is None:
            return list(text.encode())
        vocab = _shakespeare_vocab()
        missing = sorted({ch for ch in text if ch not in vocab})
        if missing:
            raise ModelSpecError(f"characters outside the model's vocabulary: {missing[:10]}")
        return [vocab.index(ch) for ch in text]

    def decode(self, tokens: list[int]) -> str:
        if self.path is None:
            return bytes(tokens).decode(errors="replace")
        vocab = _shakespeare_vocab()
        return "".join(vocab[t] for t in tokens)


def _shakespeare_vocab() -> str:
    from ml.registry import get_dataset

    vocab: str = get_dataset("shakespeare").vocab
    return vocab


def parse_model(text: str, heads: int = 4) -> ModelSpec:
    match = RANDOM.match(text)
    if match:
        large, layers, width, given_heads, seed = match.groups()
        fields = dict(LARGE) if large else {"vocab_size": 256, "context": 512, "layers": int(layers),
                                            "width": int(width), "heads": int(given_heads or 4)}
        try:
            config = DecoderConfig(**fields)
        except ValueError as exc:
            raise ModelSpecError(f"model {text!r}: {exc}") from None
        seed_value = int(seed or 0)
        return ModelSpec(text, config, "random-" + config.model_id(seed_value), seed=seed_value)
    path = Path(text)
    if not path.is_file():
        raise ModelSpecError(f"model {text!r} is neither random:<layers>x<width>[:heads][@seed] nor a file")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
        config = config_from_state(state, heads)
    except (SafetensorError, KeyError, ValueError, OSError) as exc:
        raise ModelSpecError(f"{path} is not a char-transformer safetensors file: {exc}") from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return ModelSpec(text, config, "char-" + digest, path=path)


def parse_blocks(text: str, layers: int) -> tuple[int, int]:
    match = re.fullmatch(r"(\d{1,4}):(\d{1,4})", text)
    if not match:
        raise ModelSpecError(f"blocks must be A:B, got {text!r}")
    start, end = int(match.group(1)), int(match.group(2))
    if not 0 <= start < end <= layers:
        raise ModelSpecError(f"blocks {start}:{end} are not a range inside the model's {layers} blocks")
    return start, end

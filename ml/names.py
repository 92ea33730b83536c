"""The names a training task may use (models, datasets, gradient codecs), importable without torch.

Validators and the CLI check task specs against these; ``ml.registry`` and ``ml.codecs`` hold the
implementations behind them (tests/ml/test_names.py keeps both in step).
"""
from __future__ import annotations

MODEL_NAMES = ("char-transformer", "digits-mlp")
DATASET_NAMES = ("digits", "shakespeare")
CODEC_NAMES = ("bf16", "fp16", "fp32", "int4", "int8", "sign", "topk")  # each may take a "+lz4" suffix
ARCHIVE_MODEL = "pt2"      # a task's own model: a torch.export archive (TrainSpec.model_artifact)
FILE_DATASET = "file"      # a task's own data: a file (TrainSpec.dataset_artifact)
LOSS_NAMES = ("cross_entropy", "mse", "next_token_cross_entropy")
DEVICES = ("cpu", "cuda")
INITS = ("archive", "seed")
TOKENIZERS = ("byte", "char")
POWERSGD_PREFIX = "powersgd"  # "powersgd" or "powersgd<r>", e.g. "powersgd4": use the PowerSGD class


def powersgd_rank(name: str) -> int | None:
    """The rank in "powersgd<r>" ("powersgd" alone means rank 1); None if `name` is not PowerSGD."""
    if not name.startswith(POWERSGD_PREFIX):
        return None
    digits = name[len(POWERSGD_PREFIX):]
    if digits and not digits.isdigit():
        raise ValueError(f"bad PowerSGD codec name {name!r}")
    return int(digits) if digits else 1


def is_codec_name(name: str) -> bool:
    """Whether `name` is a codec a task may ask for: a CODEC_NAMES entry (with an optional "+lz4")
    or "powersgd<r>"."""
    try:
        if powersgd_rank(name) is not None:
            return True
    except ValueError:
        return False
    base, _, suffix = name.partition("+")
    return base in CODEC_NAMES and suffix in ("", "lz4")

"""TrainSpec: everything that determines a training job's result (model, data, mode, codec, seeds,
hyper-parameters), validated and convertible to/from a plain dict for task descriptions on chain.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields

from ml.names import (
    ARCHIVE_MODEL,
    CODEC_NAMES,
    DATASET_NAMES,
    DEVICES,
    FILE_DATASET,
    INITS,
    LOSS_NAMES,
    MODEL_NAMES,
    TOKENIZERS,
    is_codec_name,
)
from ml.train.streaming_schedule import rounds_in_segment

MODES = ("data-parallel", "diloco", "streaming-diloco")
OUTER_MODES = ("diloco", "streaming-diloco")   # modes with outer steps of `inner_steps` local steps
STREAMING_CODECS = ("fp32", "fp16", "bf16", "int8", "int4")   # dense: the trainer's error feedback fits the group's
OPTIMIZERS = ("adamw", "sgd")
_ARTIFACT_ID = re.compile(r"[0-9a-f]{64}\Z")


class InvalidSpec(ValueError):
    """A TrainSpec with a bad or unknown field."""


@dataclass(frozen=True)
class TrainSpec:
    model: str = "digits-mlp"
    dataset: str = "digits"
    mode: str = "data-parallel"
    codec: str = "fp32"
    codec_options: dict = field(default_factory=dict)   # e.g. {"ratio": 0.01} for topk
    seed: int = 0
    steps: int = 600              # optimizer steps per worker (DiLoCo: inner steps in total)
    batch_size: int = 32          # per worker
    optimizer: str = "adamw"      # the (inner) optimizer: "adamw", or "sgd" (Nesterov, momentum 0.9)
    lr: float = 3e-3              # peak learning rate of that optimizer
    weight_decay: float = 0.0
    warmup_steps: int = 0
    min_lr_fraction: float = 0.0  # cosine decay from lr to lr * min_lr_fraction at the last step
    inner_steps: int = 50         # DiLoCo H: local steps per outer step
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    segment_steps: int = 10       # data-parallel: steps per committed segment (DiLoCo: one per outer step)
    report_every: int = 10        # steps between progress reports
    threads: int = 1              # torch intra-op threads (part of the reproducibility contract)
    model_artifact: str = ""      # artifact id of a torch.export archive (.pt2); then model == "pt2"
    dataset_artifact: str = ""    # artifact id of a safetensors / .npz / text file; then dataset == "file"
    eval_artifact: str = ""       # held-out data in the same format ("" = a fixed 10% of the dataset)
    loss: str = ""                # cross_entropy | mse | next_token_cross_entropy ("" = the dataset's own)
    device: str = "cpu"           # cpu | cuda
    init: str = "archive"         # archive (the archive's weights: fine-tuning) | seed (fresh, from `seed`)
    tokenizer: str = "byte"       # text datasets: byte | char
    eval_every: int = 0           # steps between held-out evaluations in progress reports (0: at the end only)
    fragments: int = 2            # streaming DiLoCo P: fragments synced in turn (docs/adr/0191)
    overlap_steps: int = 1        # streaming DiLoCo tau: inner steps an outer all-reduce overlaps (< H / P)
    mix: float = 0.5              # streaming DiLoCo alpha: applied = mix * local + (1 - mix) * outer result

    def __post_init__(self) -> None:
        if not isinstance(self.codec_options, dict):
            raise InvalidSpec(f"codec_options must be an object, got {self.codec_options!r}")
        if self.optimizer not in OPTIMIZERS:
            raise InvalidSpec(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.model not in (*MODEL_NAMES, ARCHIVE_MODEL) or self.dataset not in (*DATASET_NAMES, FILE_DATASET):
            raise InvalidSpec(f"unknown model/dataset {self.model!r}/{self.dataset!r}; known: "
                              f"{[*MODEL_NAMES, ARCHIVE_MODEL]} / {[*DATASET_NAMES, FILE_DATASET]}")
        self._check_artifacts()
        for name, allowed in (("loss", ("", *LOSS_NAMES)), ("device", DEVICES), ("init", INITS),
                              ("tokenizer", TOKENIZERS)):
            if getattr(self, name) not in allowed:
                raise InvalidSpec(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if not isinstance(self.codec, str) or not is_codec_name(self.codec):
            raise InvalidSpec(f"unknown codec {self.codec!r}; known: {list(CODEC_NAMES)} or powersgd<r>")
        if self.mode not in MODES:
            raise InvalidSpec(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("steps", "batch_size", "inner_steps", "segment_steps", "report_every", "threads", "fragments"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidSpec(f"{name} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "eval_every", "overlap_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidSpec(f"{name} must be a non-negative integer, got {value!r}")
        for name in ("lr", "weight_decay", "min_lr_fraction", "outer_lr", "outer_momentum", "mix"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InvalidSpec(f"{name} must be a finite non-negative number, got {value!r}")
        if self.mode in OUTER_MODES and self.steps % self.inner_steps:
            raise InvalidSpec(f"DiLoCo steps ({self.steps}) must be a multiple of inner_steps "
                              f"({self.inner_steps})")
        if self.mode == "streaming-diloco":
            self._check_streaming()

    def _check_streaming(self) -> None:
        if self.mix > 1:
            raise InvalidSpec(f"mix must be in [0, 1], got {self.mix!r}")
        if self.inner_steps % self.fragments:
            raise InvalidSpec(f"inner_steps ({self.inner_steps}) must be a multiple of fragments ({self.fragments})")
        if self.overlap_steps >= self.inner_steps // self.fragments:
            raise InvalidSpec(f"overlap_steps ({self.overlap_steps}) must be below inner_steps / fragments "
                              f"({self.inner_steps // self.fragments}): one fragment in flight at a time")
        if self.codec.partition("+")[0] not in STREAMING_CODECS:
            raise InvalidSpec(f"streaming-diloco takes a dense codec {STREAMING_CODECS}, got {self.codec!r}")

    def _check_artifacts(self) -> None:
        for name in ("model_artifact", "dataset_artifact", "eval_artifact"):
            value = getattr(self, name)
            if not isinstance(value, str) or (value and not _ARTIFACT_ID.match(value)):
                raise InvalidSpec(f"{name} must be an artifact id (64 lowercase hex digits), got {value!r}")
        if (self.model == ARCHIVE_MODEL) != bool(self.model_artifact):
            raise InvalidSpec(f"model {ARCHIVE_MODEL!r} goes with a model_artifact, and only it")
        if (self.dataset == FILE_DATASET) != bool(self.dataset_artifact):
            raise InvalidSpec(f"dataset {FILE_DATASET!r} goes with a dataset_artifact, and only it")
        if self.eval_artifact and self.dataset != FILE_DATASET:
            raise InvalidSpec("eval_artifact needs a dataset_artifact (registry datasets have their own split)")
        if self.model != ARCHIVE_MODEL and self.init != "archive":
            raise InvalidSpec("init applies to archive models (registry models are always seeded)")

    @property
    def outer_steps(self) -> int:
        return self.steps // self.inner_steps

    @property
    def outer_mode(self) -> bool:
        """Whether training goes in outer steps of `inner_steps` local steps (DiLoCo, streaming or not)."""
        return self.mode in OUTER_MODES

    @property
    def segment_count(self) -> int:
        """Segments a worker commits (docs/adr/0167): data-parallel ceil(steps / segment_steps), DiLoCo
        (streaming too) one per outer step of `inner_steps` steps."""
        if self.outer_mode:
            return self.outer_steps
        return -(-self.steps // self.segment_steps)

    def steps_in_segment(self, index: int) -> int:
        """Hashed steps in segment `index`: optimizer steps (data-parallel; the last segment may be
        shorter), 1 (a DiLoCo outer step) or the segment's averaging rounds (streaming DiLoCo)."""
        if not 0 <= index < self.segment_count:
            raise ValueError(f"segment {index} outside the spec's {self.segment_count}")
        if self.mode == "diloco":
            return 1
        if self.mode == "streaming-diloco":
            return rounds_in_segment(self, index)
        return min(self.segment_steps, self.steps - index * self.segment_steps)

    def first_step_of_segment(self, index: int) -> int:
        """The optimizer step segment `index` starts at."""
        return index * (self.inner_steps if self.outer_mode else self.segment_steps)

    def lr_at(self, step: int) -> float:
        """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine decay."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        floor = self.lr * self.min_lr_fraction
        return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainSpec:
        if not isinstance(data, dict):
            raise InvalidSpec(f"a train spec is a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InvalidSpec(f"unknown train spec fields: {sorted(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise InvalidSpec(str(exc)) from None

"""Datasets from files (a task's `dataset_artifact`, optional `eval_artifact`): tensors in safetensors or
.npz, or plain text, with deterministic sharding among workers and a held-out split for evaluation.

Formats (the format is read from the file's content, not its name; docs/adr/0149):
- safetensors or .npz (loaded with allow_pickle=False) holding `x` and `y` (or `features` and
  `labels`): integer labels make a classification set (loss cross_entropy, metric accuracy), float
  labels a regression set (loss mse, metric mse); float64 is stored as float32.
- the same with one 1-D integer tensor `tokens`: a token stream (loss next_token_cross_entropy,
  metrics loss and bits per token); windows of `context` tokens predict the next token.
- UTF-8 text: a token stream of its bytes (tokenizer "byte", vocabulary 256) or of its characters
  (tokenizer "char", vocabulary the sorted set of characters of the training file).
Without an eval file the held-out split is fixed by the data alone: a seeded 10% of the examples, or
the last 10% of a token stream.
"""
from __future__ import annotations

import functools
import json
import math
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ml.names import TOKENIZERS
from ml.registry.sharding import contiguous_shard, generator, shard_indices
from ml.train.bounded_zip import ZipBoundError, checked_members, read_member
from ml.train.losses import get_loss

HELD_OUT_FRACTION = 0.1
SPLIT_SEED = "file-split-v1"
EVAL_TOKENS = 65536
EVAL_BATCH = 512
KEY_PAIRS = (("x", "y"), ("features", "labels"))
MAX_UNPACKED_BYTES = 4 << 30   # an .npz's arrays, uncompressed (a small compressed file may unpack huge)
MAX_NPY_HEADER = 10_000
NPZ_KEYS = frozenset({"x", "y", "features", "labels", "tokens"})


class DatasetError(ValueError):
    """A dataset file that cannot be used (the message says why)."""


@dataclass(frozen=True)
class _Examples:
    x: torch.Tensor
    y: torch.Tensor


def file_format(path: Path) -> str:
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:4] == b"PK\x03\x04":
        return "npz"
    if len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < 100_000_000:
        return "safetensors"
    return "text"


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    fmt = file_format(path)
    try:
        if fmt == "npz":
            return _read_npz(path)
        from safetensors.torch import load_file
        return load_file(str(path))
    except (DatasetError, MemoryError):
        raise
    except (ValueError, OSError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path.name}: cannot read {fmt} tensors: {exc}") from None
    except Exception as exc:  # safetensors raises its own error type on malformed headers
        raise DatasetError(f"{path.name}: cannot read {fmt} tensors: {exc}") from None


def _read_npz(path: Path) -> dict[str, torch.Tensor]:
    """The arrays of an .npz, each member's declared size checked (total, ratio, and against the shape
    its own .npy header declares) before it is inflated, then read with a bounded reader."""
    with zipfile.ZipFile(path) as archive:
        try:
            members = checked_members(archive, path.name, MAX_UNPACKED_BYTES)
            tensors = {}
            for name, info in members.items():
                key = name[:-4] if name.endswith(".npy") else ""
                if key not in NPZ_KEYS:
                    raise DatasetError(f"{path.name}: unexpected file {name!r}: expected tensors x/y, "
                                       "features/labels or tokens")
                tensors[key] = _read_npy(path.name, archive, info)
            return tensors
        except ZipBoundError as exc:
            raise DatasetError(str(exc)) from None


def _read_npy(name: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> torch.Tensor:
    import numpy as np
    from numpy.lib import format as npy

    with archive.open(info) as member:
        version = npy.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            raise DatasetError(f"{name}: {info.filename} has .npy version {version}; save with numpy.savez")
        reader = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, fortran, dtype = reader(member, max_header_size=MAX_NPY_HEADER)
        header = member.tell()
    if dtype.hasobject:
        raise DatasetError(f"{name}: {info.filename} holds Python objects (a pickle); store numbers")
    count = math.prod(shape)
    if header + count * dtype.itemsize != info.file_size:
        raise DatasetError(f"{name}: {info.filename} declares {tuple(shape)} {dtype} ({count * dtype.itemsize} "
                           f"bytes) but holds {info.file_size - header}")
    data = read_member(archive, info, info.file_size, name)
    array = np.frombuffer(data, dtype=dtype, count=count, offset=header)
    array = array.reshape(shape[::-1]).transpose() if fortran else array.reshape(shape)
    return torch.from_numpy(np.ascontiguousarray(array))


def _text_tokens(path: Path, tokenizer: str, vocab: str | None) -> tuple[torch.Tensor, str | None]:
    import numpy as np

    data = path.read_bytes()
    if tokenizer == "byte":
        return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int64)), None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path.name}: not UTF-8 text (nor safetensors / .npz): {exc}") from None
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    known = np.unique(points) if vocab is None else np.array(sorted(map(ord, vocab)), dtype=np.uint32)
    ids = np.searchsorted(known, points)
    hits = known[np.minimum(ids, len(known) - 1)] == points if len(known) else np.zeros(len(points), bool)
    if not hits.all():
        missing = "".join(sorted({chr(c) for c in points[~hits][:1000]}))
        raise DatasetError(f"{path.name}: characters {missing[:20]!r} are not in the training text's vocabulary")
    return torch.from_numpy(ids.astype(np.int64)), "".join(map(chr, known))


def _as_examples(name: str, tensors: dict[str, torch.Tensor]):
    """_Examples, or a 1-D int64 token tensor, from a file's tensors."""
    if set(tensors) == {"tokens"}:
        tokens = tensors["tokens"]
        if tokens.dim() != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise DatasetError(f"{name}: `tokens` must be a 1-D integer tensor, got {tokens.dtype} "
                               f"{tuple(tokens.shape)}")
        if tokens.numel() and int(tokens.min()) < 0:
            raise DatasetError(f"{name}: negative token ids")
        return tokens.long()
    for xk, yk in KEY_PAIRS:
        if set(tensors) == {xk, yk}:
            x, y = tensors[xk], tensors[yk]
            if x.dim() < 1 or y.dim() < 1 or x.shape[0] != y.shape[0]:
                raise DatasetError(f"{name}: {xk} {tuple(x.shape)} and {yk} {tuple(y.shape)} differ in the number "
                                   "of examples")
            if x.dtype == torch.float64:
                x = x.float()
            if y.dtype.is_floating_point:
                y = y.float()
            elif y.dtype == torch.bool:
                raise DatasetError(f"{name}: boolean labels; store class ids as integers")
            else:
                y = y.long()
            return _Examples(x.contiguous(), y.contiguous())
    raise DatasetError(f"{name}: expected tensors x/y, features/labels or tokens, found {sorted(tensors)}")


class FileDataset:
    """A dataset read from files: `train_batch`, `loss`, `evaluate`, as the registry datasets."""

    def __init__(self, train, held_out, context: int, vocab_size: int | None):
        self.context = context
        if isinstance(train, _Examples):
            self.kind = "regression" if train.y.dtype.is_floating_point else "classification"
            self.default_loss = "mse" if self.kind == "regression" else "cross_entropy"
            if self.kind == "classification" and train.y.numel():
                if int(train.y.min()) < 0:
                    raise DatasetError("negative class labels")
            self.num_features = int(train.x[0].numel()) if train.x.shape[0] else 0
            self.num_classes = int(torch.cat([train.y, held_out.y]).max()) + 1 if self.kind == "classification" else 0
        else:
            self.kind = "tokens"
            self.default_loss = "next_token_cross_entropy"
            self.vocab_size = vocab_size or int(torch.cat([train, held_out]).max()) + 1
        self.train, self.held_out = train, held_out
        self.loss = get_loss(self.default_loss)

    @property
    def num_train(self) -> int:
        return len(self.train.y) if isinstance(self.train, _Examples) else len(self.train)

    def check_world(self, world: int) -> None:
        """Raise DatasetError when `world` workers cannot each get a share of the training data."""
        if self.kind == "tokens":
            per_worker = self.num_train // world
            if per_worker < self.context + 2:
                raise DatasetError(f"{self.num_train} training tokens are too few for {world} workers with "
                                   f"windows of {self.context}")
            if len(self.held_out) < self.context + 1:
                raise DatasetError(f"the held-out split ({len(self.held_out)} tokens) is shorter than one window "
                                   f"of {self.context}")
        elif self.num_train < world:
            raise DatasetError(f"{self.num_train} training examples are too few for {world} workers")
        elif len(self.held_out.y) == 0:
            raise DatasetError("the held-out split is empty")

    def train_batch(self, step: int, rank: int, world: int, batch_size: int, seed: int):
        """Worker `rank`'s batch at `step`: a pure function of the arguments (sharding.py)."""
        if self.kind == "tokens":
            start, end = contiguous_shard(len(self.train), rank, world)
            gen = generator("file-token-batch", seed, rank, step)
            offsets = start + torch.randint(0, end - start - self.context - 1, (batch_size,), generator=gen)
            return self._windows(self.train, offsets)
        per_epoch = max(1, (self.num_train // world) // batch_size)
        epoch, index = divmod(step, per_epoch)
        picked = shard_indices(self.num_train, rank, world, seed, epoch)[index * batch_size:(index + 1) * batch_size]
        return self.train.x[picked], self.train.y[picked]

    def _windows(self, tokens: torch.Tensor, offsets: torch.Tensor):
        index = offsets.unsqueeze(1) + torch.arange(self.context + 1).unsqueeze(0)
        chunk = tokens[index]
        return chunk[:, :-1], chunk[:, 1:]

    def eval_batches(self):
        """The held-out data in fixed batches of (inputs, targets)."""
        if self.kind == "tokens":
            span = len(self.held_out) - self.context - 1
            windows = max(1, min(EVAL_TOKENS // self.context, span + 1))
            offsets = torch.linspace(0, max(span, 0), windows).long()
            per_batch = max(1, EVAL_BATCH // 8)
            for i in range(0, windows, per_batch):
                yield self._windows(self.held_out, offsets[i:i + per_batch])
            return
        for i in range(0, len(self.held_out.y), EVAL_BATCH):
            yield self.held_out.x[i:i + EVAL_BATCH], self.held_out.y[i:i + EVAL_BATCH]

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: str = "cpu", loss=None) -> dict[str, float]:
        """Held-out metrics: accuracy (percent) and loss, mse, or loss and bits per token."""
        loss = loss or self.loss
        total, count, correct = 0.0, 0, 0
        for x, y in self.eval_batches():
            x, y = x.to(device), y.to(device)
            out = model(x)
            n = y.numel() if self.kind == "tokens" else len(y)
            total += float(loss(out, y)) * n
            count += n
            if self.kind == "classification":
                correct += int((out.argmax(dim=1) == y).sum())
        mean = total / max(count, 1)
        if self.kind == "classification":
            return {"accuracy": 100.0 * correct / max(count, 1), "loss": mean}
        if self.kind == "regression":
            return {"mse": mean}
        return {"loss": mean, "bits_per_token": mean / math.log(2)}


def _load_part(path: Path, tokenizer: str, vocab: str | None):
    if file_format(path) == "text":
        return _text_tokens(path, tokenizer, vocab)
    return _as_examples(path.name, _read_tensors(path)), vocab


def _split(data):
    if isinstance(data, _Examples):
        n = len(data.y)
        held = max(1, int(round(n * HELD_OUT_FRACTION))) if n > 1 else 0
        order = torch.randperm(n, generator=generator(SPLIT_SEED, n))
        test, train = order[:held].sort().values, order[held:].sort().values
        return _Examples(data.x[train], data.y[train]), _Examples(data.x[test], data.y[test])
    cut = len(data) - int(len(data) * HELD_OUT_FRACTION)
    return data[:cut], data[cut:]


@functools.lru_cache(maxsize=4)
def load_file_dataset(train_path: str, eval_path: str = "", tokenizer: str = "byte",
                      context: int = 64) -> FileDataset:
    """The FileDataset of a training file and an optional held-out file (shared, read-only)."""
    if tokenizer not in TOKENIZERS:
        raise DatasetError(f"unknown tokenizer {tokenizer!r}; known: {list(TOKENIZERS)}")
    train, vocab = _load_part(Path(train_path), tokenizer, None)
    if eval_path:
        held_out, _ = _load_part(Path(eval_path), tokenizer, vocab)
        if type(held_out) is not type(train):
            raise DatasetError("the eval file's format does not match the training file's")
        if isinstance(train, _Examples) and (train.x.shape[1:] != held_out.x.shape[1:]
                                             or train.y.dtype != held_out.y.dtype):
            raise DatasetError(f"the eval file's examples {tuple(held_out.x.shape[1:])}/{held_out.y.dtype} do not "
                               f"match the training file's {tuple(train.x.shape[1:])}/{train.y.dtype}")
    else:
        train, held_out = _split(train)
    vocab_size = 256 if vocab is None and tokenizer == "byte" and file_format(Path(train_path)) == "text" \
        else (len(vocab) if vocab is not None else None)
    return FileDataset(train, held_out, context, vocab_size)

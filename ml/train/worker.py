"""What every trainer shares: one worker's model, data shard, local gradient step, checkpoints,
state hashes, progress reports and the time spent computing. Torch work runs in a worker thread,
never on the event loop.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from ml.registry.sharding import derive_seed
from ml.train.averaging import Averager
from ml.train.inputs import build_inputs
from ml.train.op_randomness import draws_randomness, step_randomness
from ml.train.progress import ProgressFeed, TrainProgress
from ml.train.reproducibility import configure_determinism, hash_state, in_compute_thread
from ml.train.spec import TrainSpec
from ml.train.state_file import load_state, state_bytes
from ml.train.weights import weights_bytes

_T = TypeVar("_T")


def make_optimizer(spec: TrainSpec, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The spec's (inner) optimizer over `params`."""
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9, nesterov=True,
                               weight_decay=spec.weight_decay)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)


class TrainerBase:
    """One worker (`rank` of `world`) of a training job described by `spec`."""

    def __init__(self, spec: TrainSpec, rank: int, world: int, averager: Averager,
                 feed: ProgressFeed | None = None, files: Mapping[str, Path] | None = None):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world of {world}")
        configure_determinism(spec.threads, spec.device)
        self.spec = spec
        self.rank = rank
        self.world = world
        self.shards_from = 0   # the step since which the data is cut into `world` shards (docs/adr/0234)
        self.averager = averager
        self.feed = feed or ProgressFeed()
        inputs = build_inputs(spec, files)
        self.device = spec.device
        self.dataset, self.model, self.loss_fn = inputs.dataset, inputs.model, inputs.loss
        self._evaluate = inputs.evaluate
        if hasattr(self.dataset, "check_world"):
            self.dataset.check_world(world)
        self.params = list(self.model.parameters())
        self.draws = draws_randomness(self.model)   # random operators: steps seeded, one thread at a time
        self.inner = make_optimizer(spec, self.params)
        self.step = 0
        self.bytes_sent = 0
        self.segment_hashes: list[str] = []
        self.last_participants: tuple = ()
        self.recorder = None   # ml.train.segments.SegmentRecorder, when per-segment records are kept
        self.fault = None      # ml.train.faults.Fault: adversary modes for tests and benchmarks only
        self.compute_seconds = 0.0   # wall time spent in training computation (utilization = this / wall time)
        self._loss_sum = 0.0
        self._loss_count = 0

    # each trainer (DataParallelTrainer, OuterTrainer's DiLoCo and streaming DiLoCo) defines it: train
    # to the end (or to a stop point it takes) and return the final metrics
    run: Callable[..., Awaitable[dict]]

    async def compute(self, func: Callable[..., _T], *args: Any) -> _T:
        """`in_compute_thread(func, *args)`, its duration added to `compute_seconds`."""
        started = time.monotonic()
        try:
            return await in_compute_thread(func, *args)
        finally:
            self.compute_seconds += time.monotonic() - started

    # -- local computation (called in a worker thread) -------------------------------------------
    def _gradients(self, step: int) -> float:
        """Forward/backward on this worker's batch for `step`; leaves gradients in `p.grad`."""
        if self.fault is not None:
            faked = self.fault.gradients(self, step)
            if faked is not None:
                return faked
        x, y = self.batch_of(step, self.rank)
        return self._backward(x, y, step)

    def batch_of(self, step: int, rank: int):
        """Worker ``rank``'s batch at ``step``: its shard of `world`. Once the crew grew (``reshard``) the
        data is cut anew from ``shards_from``: steps count from there and the permutations are seeded by
        it, so every shard of one world is disjoint from the others (a pure function for replays)."""
        since = self.shards_from
        seed = derive_seed("reshard", self.spec.seed, since) if since else self.spec.seed
        return self.dataset.train_batch(step - since, rank, self.world, self.spec.batch_size, seed)

    def reshard(self, world: int, from_step: int) -> None:
        """Train on shard `rank` of `world` from `from_step` on: the crew grew to `world` seats at the epoch
        starting there (docs/adr/0234). ValueError when the dataset cannot be cut that many ways."""
        if not 0 <= self.rank < world or from_step < 0:
            raise ValueError(f"rank {self.rank} outside world of {world}, or a negative step {from_step}")
        if hasattr(self.dataset, "check_world"):
            self.dataset.check_world(world)
        self.world, self.shards_from = world, from_step

    def _backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        """Forward/backward on (x, y); random operators draw from step `step`'s seeded generator."""
        for p in self.params:
            p.grad = None
        seeded = step_randomness(self.spec.seed, self.rank, step, self.device) if self.draws \
            else contextlib.nullcontext()
        with seeded:
            loss = self.loss_fn(self.model(x.to(self.device)), y.to(self.device))
            loss.backward()
        return float(loss.detach())

    def to_host(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Tensors for the averager (which works on CPU tensors)."""
        return tensors if self.device == "cpu" else [t.detach().cpu() for t in tensors]

    def _inner_step(self, step: int) -> None:
        for group in self.inner.param_groups:
            group["lr"] = self.spec.lr_at(step)
        self.inner.step()

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {
            "model": self.model.state_dict(),
            "inner": self.inner.state_dict(),
            "step": self.step,
            "bytes_sent": self.bytes_sent,
            "segment_hashes": list(self.segment_hashes),
        }
        if hasattr(self.averager, "state_dict"):
            state["averager"] = self.averager.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.inner.load_state_dict(state["inner"])
        self.step = state["step"]
        self.bytes_sent = state["bytes_sent"]
        self.segment_hashes = list(state["segment_hashes"])
        if "averager" in state and hasattr(self.averager, "load_state_dict"):
            self.averager.load_state_dict(state["averager"])

    def training_state(self) -> dict:
        """Everything that determines how this worker continues (model, optimizer, codec state such
        as error-feedback residuals, step): what a segment checkpoint holds."""
        averager = self.averager.state_dict() if hasattr(self.averager, "state_dict") else {}
        return {"model": self.model.state_dict(), "inner": self.inner.state_dict(), "averager": averager,
                "step": self.step}

    def load_training_state(self, state: dict) -> None:
        """Continue from `training_state()` output; ValueError/KeyError/TypeError/RuntimeError if it does
        not fit this trainer."""
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            raise ValueError("not a training state")
        self.model.load_state_dict(state["model"])
        self.inner.load_state_dict(state["inner"])
        if hasattr(self.averager, "load_state_dict"):
            self.averager.load_state_dict(state["averager"])
        self.step = state["step"]

    def state_marker(self) -> tuple:
        """Changes whenever the training state does (between segments)."""
        return (self.step,)

    def checkpoint(self) -> bytes:
        """The full training state of this worker as deterministic safetensors bytes (ml.train.state_file)."""
        return state_bytes(self.training_state())

    def restore(self, checkpoint: bytes) -> None:
        self.load_training_state(load_state(checkpoint))

    def params_hash(self) -> str:
        """sha256 of the model parameters and buffers."""
        return hash_state(self.model.state_dict())

    def weights_bytes(self) -> bytes:
        """The model's weights as safetensors bytes, identical for identical weights."""
        return weights_bytes(self.model)

    def eval_due(self) -> bool:
        """Whether a progress report at the current step carries held-out metrics (spec.eval_every)."""
        return bool(self.spec.eval_every) and self.step % self.spec.eval_every == 0

    def _evaluate_keeping_state(self) -> dict[str, float]:
        # an exported graph has no eval mode: batch-norm statistics would move; put them back
        saved = [b.detach().clone() for b in self.model.buffers()]
        try:
            return self._evaluate()
        finally:
            with torch.no_grad():
                for buffer, value in zip(self.model.buffers(), saved):
                    buffer.copy_(value)

    async def evaluate(self) -> dict[str, float]:
        """Held-out metrics of the current model (it is left exactly as it was)."""
        return await in_compute_thread(self._evaluate_keeping_state)

    # -- progress ---------------------------------------------------------------------------------
    def _record_loss(self, loss: float) -> None:
        self._loss_sum += loss
        self._loss_count += 1

    def _report(self, outer_step: int | None = None, metrics: dict | None = None) -> None:
        loss = self._loss_sum / self._loss_count if self._loss_count else float("nan")
        self._loss_sum, self._loss_count = 0.0, 0
        self.feed.publish(TrainProgress(
            rank=self.rank, step=self.step, loss=loss, bytes_sent=self.bytes_sent,
            participants=len(self.last_participants), outer_step=outer_step, metrics=metrics or {},
            compute_s=round(self.compute_seconds, 3)))

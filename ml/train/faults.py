"""Adversary modes of a worker, for tests and the verification benchmark only (config
`[compute] fault_inject`): the one place where a trainer deviates from honest training.

- `lazy`: every odd step (data-parallel steps, DiLoCo inner steps) reuses the previous step's
  gradient instead of computing one.
- `partial:<q>`: each segment is faked with probability q (drawn once per segment): zero gradients
  for its steps (data-parallel) or a zero pseudo-gradient without the inner steps (DiLoCo).
- `poison_zero` / `poison_noise`: every contribution sent to the group is zeros / the true one plus
  Gaussian noise; the records hash what was sent.
- `poison_stealth`: trains and commits honestly, but sends zeros on the wire (`stealth_group` wraps the
  all-reduce group under its averager): its records and replay match; only its receivers' receipts
  (docs/adr/0167, receiver-side evidence) show what it sent.
- `wrong_segments`: commits records whose gradient hashes are made up (`falsify_records`).
- `copycat`: trains honestly but commits another worker's segments_root and serves that worker's
  records (done by the compute role, ml/compute/role.py; nothing here).
Except for `poison_stealth`, the records hash what the worker really sent, so a replay of its segment
finds the deviation.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import random
import re

import torch

MODES = ("lazy", "poison_zero", "poison_noise", "poison_stealth", "copycat")
_PARTIAL = re.compile(r"partial:(0(\.\d+)?|1(\.0+)?)\Z")
NOISE_STD = 0.01


class BadFault(ValueError):
    """A fault_inject value that names no adversary mode."""


def is_fault_mode(text: str) -> bool:
    return text in MODES or bool(_PARTIAL.match(text))


class Fault:
    """One adversary mode; `seed` fixes its random choices (None: fresh randomness)."""

    def __init__(self, mode: str, seed: int | None = None):
        if not is_fault_mode(mode):
            raise BadFault(f"unknown fault mode {mode!r}: one of {list(MODES)} or partial:<q>")
        self.mode = mode
        self.q = float(mode.split(":", 1)[1]) if mode.startswith("partial:") else 0.0
        self._rng = random.Random(seed)
        self._faked: dict[int, bool] = {}
        self._previous: tuple[list[torch.Tensor], float] | None = None

    def fake_segment(self, index: int) -> bool:
        """Whether a partial cheater fakes segment `index` (decided once per segment)."""
        if not self.mode.startswith("partial:"):
            return False
        if index not in self._faked:
            self._faked[index] = self._rng.random() < self.q
        return self._faked[index]

    def gradients(self, trainer, step: int) -> float | None:
        """Called before a step's forward/backward: leaves faked gradients in `p.grad` and returns a
        loss, or returns None to let the trainer compute them honestly."""
        if self.mode == "lazy":
            if step % 2 and self._previous is not None:
                grads, loss = self._previous
                for p, g in zip(trainer.params, grads):
                    p.grad = g.clone()
                return loss
            loss = trainer._backward(*trainer.batch_of(step, trainer.rank), step)
            self._previous = ([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                               for p in trainer.params], loss)
            return loss
        if trainer.spec.mode == "data-parallel" and self.fake_segment(step // trainer.spec.segment_steps):
            for p in trainer.params:
                p.grad = torch.zeros_like(p)
            return 0.0
        return None

    def contribution(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """What this worker sends to the group instead of `tensors`."""
        if self.mode == "poison_zero":
            return [torch.zeros_like(t) for t in tensors]
        if self.mode == "poison_noise":
            gen = torch.Generator().manual_seed(self._rng.getrandbits(63))
            return [t + NOISE_STD * torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in tensors]
        return tensors


class StealthGroup:
    """fault_inject=poison_stealth: an all-reduce group that sends zeros in place of this worker's
    contribution (dense rounds: zero tensors; all-gather rounds: the codec's encoding of zeros), while
    the averager above it, and so the records, see the honest one."""

    def __init__(self, group):
        self.group = group

    async def allreduce(self, tensors: list[torch.Tensor], round_id: int):
        return await self.group.allreduce([torch.zeros_like(t) for t in tensors], round_id)

    async def allgather_mean(self, encoded, codec, shapes, round_id: int):
        if encoded is not None:
            numel = sum(math.prod(s) for s in shapes)
            encoded = await asyncio.to_thread(codec.encode, torch.zeros(numel))
        return await self.group.allgather_mean(encoded, codec, shapes, round_id)

    def __getattr__(self, name):
        return getattr(self.group, name)


def wire_group(group, mode: str):
    """The group a worker's averager talks through under adversary `mode` (`group` unless stealthy)."""
    return StealthGroup(group) if mode == "poison_stealth" else group


def install(trainer, mode: str, seed: int | None = None) -> Fault | None:
    """Give `trainer` the adversary `mode` ("" = honest); the Fault, or None."""
    if not mode:
        return None
    trainer.fault = Fault(mode, seed)
    return trainer.fault


def falsify_records(records: list) -> list:
    """fault_inject=wrong_segments: the records with every step's gradient hash replaced (what a worker
    that commits made-up hashes sends)."""
    out = []
    for record in records:
        steps = tuple(dataclasses.replace(s, gradient=hashlib.sha256(bytes.fromhex(s.gradient)).hexdigest())
                      for s in record.steps)
        out.append(dataclasses.replace(record, steps=steps))
    return out

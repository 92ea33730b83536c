"""Streaming DiLoCo's schedule (docs/adr/0191), a pure function of the TrainSpec: which parameters
form each fragment, and when each fragment's outer all-reduce starts and when its average is applied.

Let H = inner_steps, P = fragments, tau = overlap_steps, T = steps, and "boundary s" the point after
s inner steps. The first W = leader_rounds(spec) rounds are DiLoCo's warm start (docs/adr/0096): one
blocking round of the whole model every H steps. From S0 = W*H on, fragment p's k-th round starts at
S0 + k*H + (p+1)*H/P - tau and is applied tau steps later, at S0 + k*H + (p+1)*H/P: the fragments'
syncs are staggered H/P steps apart and each overlaps tau inner steps. With tau < H/P at most one
round is in flight at any time, and none is at a boundary S0 + k*H, where segments start (so a
segment's checkpoint holds no half-done round). At T one blocking "final" round syncs the whole
model so that every worker ends with the same weights.

Segment k (k < W) is warm round k; segment W + k holds the P streaming rounds applied in
(S0 + k*H, S0 + (k+1)*H] (the last segment also the final round). Every segment covers H inner steps,
so segment k starts at step k*H as a DiLoCo segment does.

Fragments are strided over the model's layers: a layer is a parameter's name up to its first integer
component ("blocks.3.attn.qkv.weight" -> "blocks.3"), or its module ("embed.weight" -> "embed"); the
layers in order of first appearance go to fragments 0, 1, ..., P-1, 0, 1, ...
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

WARM, STREAM, FINAL = "warm", "stream", "final"


@dataclass(frozen=True)
class Round:
    index: int                  # the round id (unique in the job, in schedule order)
    segment: int
    kind: str                   # WARM | STREAM | FINAL
    fragments: tuple[int, ...]  # whose parameters the round averages, in order
    start: int                  # boundary at which the pseudo-gradient is taken and the reduce starts
    due: int                    # boundary at which its average is applied (start + tau for STREAM)


def leader_rounds(spec) -> int:
    """Outer rounds at the start in which the leader alone trains: those covering the lr warmup."""
    return min(spec.outer_steps, math.ceil(spec.warmup_steps / spec.inner_steps))


def schedule(spec) -> tuple[Round, ...]:
    """Every round of a streaming-diloco `spec`, in order (start and due both non-decreasing)."""
    return _schedule(spec.steps, spec.inner_steps, spec.fragments, spec.overlap_steps, leader_rounds(spec))


@lru_cache(maxsize=16)
def _schedule(steps: int, h: int, fragments: int, tau: int, warm: int) -> tuple[Round, ...]:
    every = tuple(range(fragments))
    rounds: list[Round] = [Round(k, k, WARM, every, (k + 1) * h, (k + 1) * h) for k in range(warm)]
    first = warm * h
    periods = (steps - first) // h
    for k in range(periods):
        for p in range(fragments):
            due = first + k * h + (p + 1) * (h // fragments)
            rounds.append(Round(len(rounds), warm + k, STREAM, (p,), due - tau, due))
    if periods:
        rounds.append(Round(len(rounds), warm + periods - 1, FINAL, every, steps, steps))
    return tuple(rounds)


def rounds_in_segment(spec, index: int) -> int:
    """Averaging rounds (hashed steps of the segment record) in segment `index` of `spec.outer_steps`."""
    if index < leader_rounds(spec):
        return 1
    return spec.fragments + (index == spec.outer_steps - 1)


def layer_of(name: str) -> str:
    """The layer a parameter belongs to (see the module doc)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) or name


def fragment_of_params(names: list[str], fragments: int) -> list[int]:
    """The fragment of each parameter (by its name, in model order); ValueError when the model has
    fewer layers than fragments (a fragment would be empty)."""
    layers: dict[str, int] = {}
    for name in names:
        layers.setdefault(layer_of(name), len(layers))
    if len(layers) < fragments:
        raise ValueError(f"{fragments} fragments need at least as many layers; the model has {len(layers)}")
    return [layers[layer_of(name)] % fragments for name in names]

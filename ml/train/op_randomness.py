"""Random operators in a task's graph, made reproducible (docs/adr/0185).

Dropout and its variants, attention's dropout_p, RNN dropout between layers, rand, bernoulli, ...
draw from torch's default generator. `step_randomness(seed, rank, step, device)` seeds that generator
(CPU, and the task's CUDA device) for one training step from the task's seed, the worker's rank and
the step, inside `torch.random.fork_rng`, so the draws are a function of the task alone: a verifier
replaying the step (the same trainer code, ml/compute/segment_replay.py) draws the same masks, and
nothing outside the step sees its generator move. The generators are process-wide, so the seeded
block holds `ml.global_rng.GENERATORS` throughout (docs/adr/0196): without it a second worker or a
verifier computing in another thread of the process reseeds the generator between this step's seeding
and its draws. A module without random operators (`draws_randomness`) need not be seeded, and its
steps then run in parallel with other threads'.

An exported graph has no eval mode (`GraphModule.eval()` raises), so `switchable_randomness` replaces
each random operator node of a trainable module by a call that runs the operator unchanged while
training and with its randomness off (train=False, dropout_p=0) inside `evaluating()`: held-out
metrics are those of the model without dropout, as `model.eval()` would give.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ml.global_rng import GENERATORS
from ml.registry.sharding import derive_seed
from ml.train.op_policy import RANDOM_ATEN_OPS

# argument that turns an operator's randomness off, and its "off" value (first match in the schema)
_OFF = (("train", False), ("training", False), ("dropout_p", 0.0))
_state = threading.local()


def is_evaluating() -> bool:
    return bool(getattr(_state, "evaluating", False))


@contextlib.contextmanager
def evaluating() -> Iterator[None]:
    """Random operators of switchable modules run with their randomness off in this thread."""
    previous = is_evaluating()
    _state.evaluating = True
    try:
        yield
    finally:
        _state.evaluating = previous


@contextlib.contextmanager
def seeded(*parts: object, device: str = "cpu") -> Iterator[None]:
    """torch's default generators (CPU, and the current CUDA device for a cuda `device`) seeded from
    `parts` for the block, restored after it; no other thread seeds or draws from them meanwhile."""
    cuda = torch.device(device).type == "cuda"
    devices = [torch.cuda.current_device()] if cuda else []
    with GENERATORS, torch.random.fork_rng(devices=devices, device_type="cuda"):
        seed = derive_seed("op-randomness", *parts)
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.manual_seed(seed)
        yield


def step_randomness(seed: int, rank: int, step: int, device: str = "cpu"):
    """The generator state of worker `rank`'s training step `step` of a task seeded `seed`."""
    return seeded("step", seed, rank, step, device=device)


def eval_randomness(seed: int, device: str = "cpu"):
    """A fixed generator state for held-out evaluation (random operators other than dropout, such as a
    model's own torch.rand noise, give the same metrics on every worker)."""
    return seeded("eval", seed, device=device)


def _is_random_call(target: object) -> bool:
    return (isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"
            and target._schema.name.split("::")[-1] in RANDOM_ATEN_OPS) or is_switchable_call(target)


def draws_randomness(module: torch.nn.Module) -> bool:
    """Whether running `module` may draw from torch's default generators: a graph module (an archive's)
    when one of its graphs calls a random operator; any other module unless its class says it does
    not (`draws_randomness = False`, as the registry's models do)."""
    if not isinstance(module, torch.fx.GraphModule):
        return bool(getattr(module, "draws_randomness", True))
    return any(node.op == "call_function" and _is_random_call(node.target)
               for sub in module.modules() if isinstance(sub, torch.fx.GraphModule) for node in sub.graph.nodes)


def _off_argument(op: torch._ops.OpOverload) -> tuple[int, str, Any] | None:
    names = [a.name for a in op._schema.arguments]
    for name, value in _OFF:
        if name in names:
            return names.index(name), name, value
    return None


def _switchable(op: torch._ops.OpOverload, index: int, name: str, off: Any) -> Callable:
    def call(*args, **kwargs):
        if is_evaluating():
            if name in kwargs or index >= len(args):
                kwargs = {**kwargs, name: off}
            else:
                args = (*args[:index], off, *args[index + 1:])
        return op(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"switchable_{op.__name__.replace('.', '_')}"
    call.__module__ = __name__
    return call


_SWITCHABLE: dict[torch._ops.OpOverload, Callable] = {}
_SWITCHABLE_MADE = threading.Lock()   # one switchable form per operator, even when trainers load in parallel


def switchable(op: torch._ops.OpOverload) -> Callable | None:
    """The switchable form of random operator `op` (None when it has no off switch, e.g. rand)."""
    with _SWITCHABLE_MADE:
        if op not in _SWITCHABLE:
            found = _off_argument(op)
            if found is None:
                return None
            _SWITCHABLE[op] = _switchable(op, *found)
        return _SWITCHABLE[op]


def is_switchable_call(target: object) -> bool:
    return any(target is fn for fn in _SWITCHABLE.values())


def switchable_randomness(module: torch.fx.GraphModule) -> int:
    """Replace the random operator nodes of `module` that have an off switch by their switchable form
    (in place); returns how many were replaced."""
    replaced = 0
    for node in module.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and _is_random_call(target):
            call = switchable(target)
            if call is not None:
                node.target = call
                replaced += 1
    if replaced:
        module.recompile()
    return replaced

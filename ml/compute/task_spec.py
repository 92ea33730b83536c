"""Translation between a task as the ledger holds it and the TrainSpec a worker trains.

The ledger's submit_task payload names `model`, `dataset`, `workers`, `sync_mode` ("allreduce",
"diloco" or "streaming"), `codec` and a `hyperparams` map. The canonical ledger encoding has no floats, so float
hyper-parameters travel as decimal text and `codec_options` as JSON text; text fields (artifact ids,
loss, device, init, tokenizer) as themselves; `train_spec_for_task`
reverses that and validates the result; `segments` is the spec's segment count, which the ledger
holds every commitment to and a worker checks (`check_segments`) (an unknown or malformed task raises InvalidTask, so a
compute node skips it instead of crashing).
"""
from __future__ import annotations

import json
from dataclasses import fields

from consensus.task_info import TaskInfo
from ml.train.spec import InvalidSpec, TrainSpec

MODEL_ALIASES = {"mlp": "digits-mlp", "transformer": "char-transformer"}
SYNC_MODES = {"allreduce": "data-parallel", "diloco": "diloco", "streaming": "streaming-diloco"}
_ON_PAYLOAD = ("model", "dataset", "codec", "mode")   # TrainSpec fields carried outside hyperparams
_FIELD_TYPES = {f.name: f.type for f in fields(TrainSpec)}


class InvalidTask(ValueError):
    """A ledger task that cannot be turned into a TrainSpec."""


def model_name(name: str) -> str:
    """The registry name for a model given by its short alias ("mlp") or its full name."""
    return MODEL_ALIASES.get(name, name)


def _encode_value(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, dict, str)):
        raise InvalidTask(f"cannot put {value!r} in a task's hyperparams")
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return repr(value)
    return value


def submit_payload(spec: TrainSpec, workers: int, price: int, profile: str = "") -> dict:
    """The submit_task payload for training `spec` with `workers` workers for `price`, in execution
    profile `profile` (ml.profiles; "" leaves it out: the ledger picks one)."""
    sync_mode = next(name for name, mode in SYNC_MODES.items() if mode == spec.mode)
    defaults = TrainSpec()
    hyperparams = {name: _encode_value(getattr(spec, name)) for name in _FIELD_TYPES
                   if name not in _ON_PAYLOAD and getattr(spec, name) != getattr(defaults, name)}
    payload = {"model": spec.model, "dataset": spec.dataset, "hyperparams": hyperparams, "workers": workers,
               "sync_mode": sync_mode, "codec": spec.codec, "price": price, "segments": spec.segment_count}
    if profile:
        payload["profile"] = profile
    return payload


def declared_segments(task: TaskInfo) -> int | None:
    """The segment count a ledger task declares (`segments`, on the task, 0 when it declares none; or in
    its spec map), or None for a task from before segment counts (docs/adr/0167)."""
    value = task.segments or task.spec_field("segments")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidTask(f"the task declares an invalid segment count {value!r}")
    return value


def check_segments(task: TaskInfo, spec: TrainSpec) -> None:
    """InvalidTask when the task's declared segment count differs from its spec's (a worker committing
    to the declared count would commit to segments the spec does not have)."""
    declared = declared_segments(task)
    if declared is not None and declared != spec.segment_count:
        raise InvalidTask(f"the task declares {declared} segments, its spec has {spec.segment_count}")


def _decode_value(name: str, value):
    kind = _FIELD_TYPES.get(name)
    if kind is None:
        raise InvalidTask(f"unknown hyper-parameter {name!r}")
    try:
        if kind == "str" and not isinstance(value, str):
            raise InvalidTask(f"hyper-parameter {name} must be text")
        if kind == "float":
            return float(value) if isinstance(value, str) else value
        if kind == "dict":
            decoded = json.loads(value)
            if not isinstance(decoded, dict):
                raise InvalidTask(f"{name} must be a JSON object")
            return decoded
    except (TypeError, ValueError) as exc:
        raise InvalidTask(f"hyper-parameter {name}: {exc}") from None
    return value


def train_spec_for_task(task_spec: dict) -> TrainSpec:
    """The TrainSpec of a ledger task's `spec` map (as dkb_getTask returns it)."""
    try:
        hyperparams = task_spec.get("hyperparams", {})
        if not isinstance(hyperparams, dict):
            raise InvalidTask("hyperparams must be a map")
        mode = SYNC_MODES.get(task_spec["sync_mode"])
        if mode is None:
            raise InvalidTask(f"unknown sync mode {task_spec['sync_mode']!r}")
        values = {name: _decode_value(name, value) for name, value in hyperparams.items()
                  if name not in _ON_PAYLOAD}
        return TrainSpec(model=model_name(task_spec["model"]), dataset=task_spec["dataset"],
                         codec=task_spec["codec"], mode=mode, **values)
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidTask(f"malformed task spec: {exc!r}") from None
    except InvalidSpec as exc:
        raise InvalidTask(str(exc)) from None

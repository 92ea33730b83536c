"""A trainer's full state (nested dicts/lists/tuples of tensors and plain values) as deterministic
safetensors bytes, and back, without unpickling anything.

Tensors go in the safetensors body, named by their position in the structure ("t0", "t1", ... in walk
order); the structure itself (the skeleton) goes in the metadata as canonical JSON, each container
tagged so that tuples, int dict keys and None survive the round trip:
{"d": [[key, value], ...]} (keys in sorted order), {"l": [...]}, {"u": [...]} (a tuple), {"x": "t3"}
(a tensor), or a plain JSON scalar. Identical states give identical bytes, so the sha256 of the bytes
is the state's hash. `load_state` checks hostile input: bounded sizes and depth, every tensor
referenced exactly once, nothing but these forms.
"""
from __future__ import annotations

import json
import math
from typing import Any

import torch

SKELETON_KEY = "dekube-state"
MAX_SKELETON_BYTES = 4 << 20
MAX_DEPTH = 32


class BadStateFile(ValueError):
    """Bytes that are not a state file this module wrote."""


def _skeleton(value: Any, tensors: dict[str, torch.Tensor], depth: int = 0, storages: set | None = None) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError("state nested too deeply")
    storages = set() if storages is None else storages
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensor = value.detach()
        storage = (tensor.device.type, tensor.untyped_storage().data_ptr())
        # the state's own CPU tensors are written as they are (a copy of a 100M-parameter state is 2.3 GB more
        # at each checkpoint); one that shares its storage with another (tied weights) or lies elsewhere is
        # copied, as the file needs each tensor on its own
        if tensor.device.type != "cpu" or storage in storages or not tensor.is_contiguous():
            tensor = tensor.to("cpu", copy=True).contiguous()
        storages.add(storage)
        tensors[name] = tensor
        return {"x": name}
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: (isinstance(kv[0], str), kv[0]))
        for key, _ in items:
            if isinstance(key, bool) or not isinstance(key, (int, str)):
                raise ValueError(f"state dict key {key!r} is not text or an integer")
        return {"d": [[key, _skeleton(item, tensors, depth + 1, storages)] for key, item in items]}
    if isinstance(value, list):
        return {"l": [_skeleton(item, tensors, depth + 1, storages) for item in value]}
    if isinstance(value, tuple):
        return {"u": [_skeleton(item, tensors, depth + 1, storages) for item in value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"state holds a non-finite number {value!r}")
        return value
    raise ValueError(f"cannot store a {type(value).__name__} in a state file")


def state_bytes(state: Any) -> bytes:
    """`state` as deterministic safetensors bytes (blocking: a pass over every tensor; the bytes are the
    state's size, and the file writer holds one more copy of it while it builds them)."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    skeleton = json.dumps(_skeleton(state, tensors), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return save(tensors, metadata={SKELETON_KEY: skeleton})


def _rebuild(node: Any, tensors: dict[str, torch.Tensor], used: set[str], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise BadStateFile("state nested too deeply")
    if node is None or isinstance(node, (bool, int, str)):
        return node
    if isinstance(node, float):
        if not math.isfinite(node):
            raise BadStateFile("state holds a non-finite number")
        return node
    if not isinstance(node, dict) or len(node) != 1:
        raise BadStateFile("malformed state skeleton")
    (tag, body), = node.items()
    if tag == "x":
        if not isinstance(body, str) or body not in tensors or body in used:
            raise BadStateFile(f"state names a missing or repeated tensor {str(body)[:40]!r}")
        used.add(body)
        return tensors[body]
    if not isinstance(body, list):
        raise BadStateFile("malformed state skeleton")
    if tag == "l":
        return [_rebuild(item, tensors, used, depth + 1) for item in body]
    if tag == "u":
        return tuple(_rebuild(item, tensors, used, depth + 1) for item in body)
    if tag == "d":
        out: dict = {}
        for pair in body:
            if (not isinstance(pair, list) or len(pair) != 2 or isinstance(pair[0], bool)
                    or not isinstance(pair[0], (int, str)) or pair[0] in out):
                raise BadStateFile("malformed state dict entry")
            out[pair[0]] = _rebuild(pair[1], tensors, used, depth + 1)
        return out
    raise BadStateFile(f"unknown state tag {tag[:20]!r}")


def read_tensor_file(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of safetensors bytes (no pickle); BadStateFile if they are not safetensors."""
    from safetensors.torch import load

    try:
        tensors = load(data)
        header_len = int.from_bytes(data[:8], "little")
        if header_len > MAX_SKELETON_BYTES + (1 << 20):
            raise BadStateFile("safetensors header too large")
        header = json.loads(data[8:8 + header_len])
        metadata = header.get("__metadata__") or {}
    except BadStateFile:
        raise
    except Exception as exc:  # safetensors raises its own error types for malformed input
        raise BadStateFile(f"not a safetensors file: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadStateFile("malformed safetensors metadata")
    return tensors, metadata


def load_state(data: bytes) -> Any:
    """The state `state_bytes` wrote (tensors on CPU); BadStateFile on anything else."""
    tensors, metadata = read_tensor_file(data)
    skeleton_text = metadata.get(SKELETON_KEY)
    if skeleton_text is None or len(skeleton_text) > MAX_SKELETON_BYTES:
        raise BadStateFile("no state skeleton, or an oversized one")
    try:
        skeleton = json.loads(skeleton_text)
    except (ValueError, RecursionError):
        raise BadStateFile("state skeleton is not JSON") from None
    used: set[str] = set()
    state = _rebuild(skeleton, tensors, used)
    if used != set(tensors):
        raise BadStateFile("state file holds tensors its skeleton does not name")
    return state

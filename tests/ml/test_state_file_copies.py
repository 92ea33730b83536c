"""ml/train/state_file.py writes a trainer state without copying it first: the bytes are those of a state
whose every tensor was copied (the format does not change, so the digests every replica computes stay the
same), tensors that share storage (tied weights, views of one buffer) and non-contiguous ones still come
out right, and the extra memory of a checkpoint is about twice the state, not three times."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save

from ml.train import state_file
from ml.train.state_file import load_state, state_bytes

ROOT = Path(__file__).resolve().parents[2]


def copied_bytes(state) -> bytes:
    """The reference: every tensor copied before the file is written (what state_bytes did before)."""
    tensors: dict[str, torch.Tensor] = {}
    original = state_file._skeleton

    def copying(value, found, depth=0, storages=None):
        if isinstance(value, torch.Tensor):
            name = f"t{len(found)}"
            found[name] = value.detach().to("cpu", copy=True).contiguous()
            return {"x": name}
        if isinstance(value, dict):
            items = sorted(value.items(), key=lambda kv: (isinstance(kv[0], str), kv[0]))
            return {"d": [[k, copying(v, found, depth + 1)] for k, v in items]}
        if isinstance(value, list):
            return {"l": [copying(v, found, depth + 1) for v in value]}
        if isinstance(value, tuple):
            return {"u": [copying(v, found, depth + 1) for v in value]}
        return original(value, found, depth)
    import json
    skeleton = json.dumps(copying(state, tensors), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return save(tensors, metadata={state_file.SKELETON_KEY: skeleton})


def test_the_bytes_are_those_of_copies_with_shared_and_strided_tensors():
    generator = torch.Generator().manual_seed(0)
    buffer = torch.randn(64, generator=generator)
    embed = torch.randn(8, 4, generator=generator)
    state = {"model": {"embed.weight": embed, "head.weight": embed,           # tied: one tensor twice
                       "a": buffer[:16], "b": buffer[16:48],                  # views of one buffer
                       "t": torch.randn(4, 6, generator=generator).t()},      # not contiguous
             "anchor": [torch.randn(5, generator=generator), buffer[48:]], "residuals": (torch.zeros(0),),
             "step": 7, "lr": 0.5}
    data = state_bytes(state)
    assert data == copied_bytes(state)
    back = load_state(data)
    assert torch.equal(back["model"]["head.weight"], embed) and torch.equal(back["model"]["t"], state["model"]["t"])
    assert torch.equal(back["anchor"][1], buffer[48:]) and back["step"] == 7
    assert torch.equal(embed, state["model"]["embed.weight"])   # the state itself is left as it was


MEASURE = """
import torch
from ml.train.state_file import state_bytes

def status(field):   # this process's memory (kB): VmHWM is its peak since exec, unlike ru_maxrss
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

numel = 4_000_000   # 8 tensors of 16 MB: 128 MB of state
state = {"model": {f"w{i}": torch.full((numel,), float(i)) for i in range(4)},
         "inner": [torch.ones(numel) for _ in range(4)], "step": 1}
before = status("VmRSS")
data = state_bytes(state)
print(status("VmHWM") - before, 8 * numel * 4, len(data))
"""


def test_a_checkpoint_takes_about_twice_the_state_not_three_times():
    # in a fresh process: a peak resident size measured after other tests would hide the checkpoint's own
    done = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=120, check=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    grown, size, written = (int(x) for x in done.stdout.split())
    assert written > size
    assert 0.8 * size < grown < 2.6 * size, (grown, size)   # the bytes themselves, and not a copy of the state first

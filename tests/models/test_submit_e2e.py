"""The issue's models through the network (DEKUBE_SLOW=1): a user's GRU, nn.MultiheadAttention (LayerNorm,
Embedding, bool causal mask), stock nn.TransformerEncoderLayer(dropout=0.0, norm_first=True) and a 2-layer
nn.TransformerEncoder of them, plus a layer with dropout, exported with a dynamic batch as the README shows,
go through `task submit --wait --out` on a loopback devnet (2 validators, 3 compute nodes: the dry run, the
files served to the workers, training, audits, payouts, weights fetched), and the fetched weights load with
load_state_dict(strict=True) into the user's own class. The CLI runs as the user runs it.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from devtools.devnet import ComputeDevnet
from tests.models.test_conformance import dataset_for, export_as_a_user
from tests.models.zoo import ARCHS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
NETWORK_MODELS = ("gru", "multihead-attention-causal", "transformer-encoder", "transformer-encoder-layer",
                  "transformer-encoder-layer-dropout")
STEPS = 6


def cli(*argv, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def devnet(tmp_path_factory):
    net = ComputeDevnet.create(tmp_path_factory.mktemp("devnet"), validators=2, compute=3)
    try:
        net.up(timeout=120)
        yield net
    finally:
        net.down(timeout=5)


@pytest.mark.parametrize("name", NETWORK_MODELS)
def test_user_model_trains_through_task_submit_and_loads_strictly(devnet, tmp_path, name):
    arch = next(a for a in ARCHS if a.name == name)
    user, model = export_as_a_user(arch, tmp_path / "model.pt2")
    data = dataset_for(arch.kind, tmp_path / "tokens.safetensors")
    out = tmp_path / "trained"
    done = cli("task", "submit", "--rpc", devnet.rpc_url, "--key", str(devnet.testnet.root / "faucet_key.json"),
               "--model", str(model), "--dataset", str(data), "--optimizer", "adamw", "--lr", "3e-3", "--batch", "8",
               "--steps", str(STEPS), "--segment-steps", "3", "--workers", "3", "--codec", "fp32",
               "--price", "100000", "--wait", "--out", str(out), "--timeout", "360")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dry run: one step ran locally" in done.stdout
    assert re.search(r"task ([0-9a-f]{64}) submitted", done.stdout) and "payouts of task" in done.stdout
    weights = load_file(str(out / "weights.safetensors"))
    before = {k: v.clone() for k, v in user.state_dict().items()}
    user.load_state_dict(weights, strict=True)                    # the user's own class takes them as they are
    assert any(not torch.equal(before[k], v) for k, v in user.state_dict().items())
    user.eval()
    assert user(arch.example()).shape == (4, 16, 64)

"""Issue 23 item 5 on the product path at CI size: the GPT-style decoder of devtools/gpt_decoder.py (the
~100M model's own code, tiny config) exported by its owner as a `.pt2`, submitted with a token file as a
task on a local devnet (1 validator, 3 compute node processes on loopback TCP), trained in streaming DiLoCo
int4 over two epochs, audited by the ledger's verifiers (every drawn segment replayed), paid, and fetched
by the owner from the workers: the weights load strictly into the owner's own class and predict its
held-out tokens better than the initial weights. The run is bench/gpt_task.py's (``--config big`` is the
~100M model there)."""
from __future__ import annotations

import argparse
import asyncio

import pytest

from bench.gpt_task import add_arguments, run_task
from devtools.devnet import ComputeDevnet
from devtools.gpt_decoder import TINY

pytestmark = pytest.mark.timeout(420)


def test_the_decoder_trains_as_a_task_is_audited_paid_and_fetched(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    net = ComputeDevnet.create(tmp_path / "devnet", validators=1, compute=3)
    try:
        net.up(timeout=120)
        out = asyncio.run(run_task(net, TINY, args, tmp_path))
    finally:
        net.down(timeout=5)
    assert out["status"] == "paid", out
    assert out["slots"] and set(out["slots"]) == {"ok"}, out["slots"]   # every drawn segment replayed
    assert out["outer_steps"] == 8 and out["epochs"] == 2
    assert out["eval_loss_fetched"] < 0.8 * out["eval_loss_initial"], out
    assert len(out["workers_usage"]) == 3
    for usage in out["workers_usage"].values():   # each seat's own account, over dkb_taskProgress
        assert usage["state"] == "committed" and 0 < usage["utilization"] <= 1 and usage["compute_s"] > 0

"""Real validator processes over an emulated WAN: each in its own namespace of a ``WanLab``, placed
round-robin over the consensus simulator's ten AWS regions, every pair of hosts joined with the
region pair's one-way delay (CloudPing RTT / 2, no jitter), and a measuring client one zero-delay
hop from all of them (``finality_client.py``). ``run_processes`` returns the client's figures.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from devtools.consensus_sim.wan import REGIONS, rtt_ms
from devtools.netlab.wan_lab import WanLab
from devtools.testnet import REPO_ROOT, Testnet

BASE_PORT = 26600


def delay_matrix(validators: int) -> list[list[float]]:
    """One-way ms between validators (round-robin regions, RTT / 2) plus a last row and column of
    zeros: the measuring client."""
    regions = [REGIONS[i % len(REGIONS)] for i in range(validators)]
    rows = [[0.0 if i == j else rtt_ms(a, b) / 2 for j, b in enumerate(regions)] + [0.0]
            for i, a in enumerate(regions)]
    return rows + [[0.0] * (validators + 1)]


def run_processes(validators: int, seconds: float, warmup: float, tx_rate: float) -> dict:
    lab = WanLab().build_wan(delay_matrix(validators))
    try:
        with tempfile.TemporaryDirectory(prefix="dkwan") as root:
            testnet = Testnet.create(root, validators, chain_id="wan-processes", base_port=BASE_PORT,
                                     hosts=lab.hosts[:validators])
            try:
                for i, node in enumerate(testnet.nodes):
                    testnet.start_node(node, netns=lab.ns(i))
                spec = {"urls": [n.rpc_url for n in testnet.nodes], "chain_id": testnet.chain_id,
                        "faucet_key": str(testnet.faucet_key), "seconds": seconds, "warmup_s": warmup,
                        "tx_rate": tx_rate}
                client = subprocess.run(
                    ["ip", "netns", "exec", lab.ns(validators), sys.executable, "-m", "devtools.netlab.finality_client",
                     json.dumps(spec)], capture_output=True, text=True, cwd=str(REPO_ROOT),
                    env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=seconds + warmup + 300)
                if client.returncode != 0:
                    raise SystemExit(f"the finality client failed: {client.stderr[-2000:]}")
                return json.loads(client.stdout.strip().splitlines()[-1])
            finally:
                testnet.down()
    finally:
        lab.teardown()

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


def delay_matrix(validators: int, slow_ms: float = 0.0) -> list[list[float]]:
    """One-way ms between validators (round-robin regions, RTT / 2; ``slow_ms`` more on every link of
    a third of them, ``slow_third``) plus a last row and column of zeros: the measuring client."""
    regions = [REGIONS[i % len(REGIONS)] for i in range(validators)]
    slow = slow_third(validators)
    rows = [[0.0 if i == j else rtt_ms(a, b) / 2 + (slow_ms if i in slow or j in slow else 0.0)
             for j, b in enumerate(regions)] + [0.0]
            for i, a in enumerate(regions)]
    return rows + [[0.0] * (validators + 1)]


def slow_third(validators: int) -> set[int]:
    """Every third validator from index 2 (equal stake: a third of the stake, never v0 or v1)."""
    return set(range(2, validators, 3))


def run_processes(validators: int, seconds: float, warmup: float, tx_rate: float, *,
                  crash: int = 0, slow_ms: float = 0.0) -> dict:
    """The client's figures; ``crash`` validators (v1, v2, ...) SIGKILLed when the measured window
    starts; ``slow_ms`` added to every link of a third of the validators (``slow_third``)."""
    if crash and not 0 <= crash < validators - 1:
        raise ValueError("crash leaves v0 (the reference) and at least one other validator")
    lab = WanLab().build_wan(delay_matrix(validators, slow_ms))
    try:
        with tempfile.TemporaryDirectory(prefix="dkwan") as root:
            testnet = Testnet.create(root, validators, chain_id="wan-processes", base_port=BASE_PORT,
                                     hosts=lab.hosts[:validators])
            try:
                testnet.launchers = {node.name: ("ip", "netns", "exec", lab.ns(i))
                                     for i, node in enumerate(testnet.nodes)}
                pids = [testnet.start_node(node) for node in testnet.nodes]
                spec = {"urls": [n.rpc_url for n in testnet.nodes], "chain_id": testnet.chain_id,
                        "faucet_key": str(testnet.faucet_key), "seconds": seconds, "warmup_s": warmup,
                        "tx_rate": tx_rate, "crash_pids": pids[1:1 + crash]}
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

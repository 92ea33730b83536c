"""A local testnet with compute nodes: validators from `devtools.testnet` plus funded compute nodes
(`dekube-node start --role compute` processes on 127.0.0.1), for the end-to-end task flow and demo.

    dekube-node testnet up --home DIR --validators 2 --compute 4
    dekube-node testnet down --home DIR

`up` creates the network unless DIR holds one, starts every process and waits until every compute
node is registered and bonded on the ledger. Compute node I lives in DIR/cI (key, config, node.log),
listens for p2p on a port the kernel picks (its registration carries the bound address) and uses
validator I mod V's RPC. Its RPC sends CORS headers to the validators' origins, so their explorer pages
(``explorer_url``) can draw its training curves.
"""
from __future__ import annotations

import json
import random
import signal
import socket
import time
from pathlib import Path

from devtools.testnet import NodeSpec, Testnet, TestnetError
from node.config import load_config
from node.identity import Identity
from node.keystore import KEY_FILE_NAME, save_identity
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError

COMPUTE_MANIFEST = "compute.json"
COMPUTE_FUNDS = 10**7
# The stake each dev compute node keeps bonded: a worker needs 10x its pay at risk (ADR 0188): the
# README's job (price 100,000 over 3 workers: ~28,333 each, 2 audits at a 10% slash) needs 283,330, a
# one-worker task at that price 850,000.
COMPUTE_STAKE = 1_000_000
FAST_TASK_PARAMS = {"audit_window_s": 12, "audit_answer_s": 45, "dispute_s": 20, "task_min_s": 90,
                    "task_slack_s": 30, "referees": 1}
# referees 1: a dev network of 4 compute nodes has 1-2 nodes left to referee a disputed slot (not the
# worker, its verifiers or the owner), and a verdict needs a majority of the `referees` seats (ADR 0188)
# seconds of block time (ADR 0187): room for a replay; a drawn verifier (or referee) answers within
# audit_answer_s (plus its segment's share of the task's expected_s), an accused worker disputes within
# dispute_s, on a loaded 2-core machine too; workers commit within task_min_s, or 4 x expected_s + slack
# when the submitter declared one (a dead worker holds the others up for a quarter of that)


def quiet_ports(count: int, low: int = 20_000, high: int = 32_000) -> list[int]:
    """Free ports below the kernel's ephemeral range, so outgoing connections of the running
    validators cannot take them between picking and binding (as happens with bind-to-0 picks)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in ports:
            ports.append(port)
    return ports


class ComputeDevnet:
    __test__ = False

    def __init__(self, testnet: Testnet, compute: list[NodeSpec]):
        self.testnet = testnet
        self.compute = compute

    @property
    def rpc_url(self) -> str:
        return self.testnet.nodes[0].rpc_url

    @classmethod
    def create(cls, root: Path | str, validators: int = 2, compute: int = 4, *, chain_id: str = "dekube-devnet",
               params: dict | None = None, compute_settings: dict[str, str] | None = None,
               validator_settings: dict[str, str] | None = None) -> ComputeDevnet:
        """Write the validators' testnet (compute nodes funded at genesis) and the compute homes;
        ``validator_settings``: the validators' config overrides "section.key" -> text (e.g. a faster
        block rate with ``consensus.empty_block_wait``)."""
        root = Path(root).expanduser()
        idents = [Identity.generate() for _ in range(compute)]
        testnet = Testnet.create(root, validators, chain_id=chain_id,
                                 balances={i.peer_id: COMPUTE_FUNDS for i in idents},
                                 params={**FAST_TASK_PARAMS, **(params or {})}, settings=validator_settings)
        rpc_ports = quiet_ports(compute)
        nodes = []
        for i, ident in enumerate(idents):
            node = NodeSpec(f"c{i}", root / f"c{i}", ident.peer_id, 0, rpc_ports[i])
            node.home.mkdir(mode=0o700, exist_ok=True)
            save_identity(node.home / KEY_FILE_NAME, ident)
            overrides = {
                ("node", "roles"): "compute",
                ("p2p", "listen"): "/ip4/127.0.0.1/tcp/0",  # the bound address is what gets registered
                ("rpc", "host"): "127.0.0.1",
                ("rpc", "port"): str(node.rpc_port),
                ("consensus", "chain_id"): chain_id,
                ("compute", "rpc_url"): testnet.nodes[i % len(testnet.nodes)].rpc_url,
                ("compute", "stake"): str(COMPUTE_STAKE),
                # the validators' explorer pages read this node's training progress (dkb_taskProgress)
                ("rpc", "cors"): "true",
                ("rpc", "allowed_origins"): ",".join(v.rpc_url for v in testnet.nodes),
            }
            for name, value in (compute_settings or {}).items():
                section, _, key = name.partition(".")
                overrides[(section, key)] = value
            (node.home / "config.toml").write_text(load_config(None, env={}, overrides=overrides).to_toml())
            nodes.append(node)
        (root / COMPUTE_MANIFEST).write_text(json.dumps([
            {"name": n.name, "peer_id": n.peer_id, "p2p_port": n.p2p_port, "rpc_port": n.rpc_port} for n in nodes]))
        return cls(testnet, nodes)

    def explorer_url(self) -> str:
        """The first validator's explorer page with every compute node's RPC listed (``?nodes=``), so the
        page draws the training curves they report."""
        return f"{self.rpc_url}/explorer/?nodes=" + ",".join(n.rpc_url for n in self.compute)

    @classmethod
    def load(cls, root: Path | str) -> ComputeDevnet:
        root = Path(root).expanduser()
        testnet = Testnet.load(root)
        try:
            entries = json.loads((root / COMPUTE_MANIFEST).read_text())
        except FileNotFoundError:
            raise TestnetError(
                f"{root} holds no compute nodes (create with 'dekube-node testnet up --compute N')") from None
        return cls(testnet, [NodeSpec(e["name"], root / e["name"], e["peer_id"], e["p2p_port"], e["rpc_port"])
                             for e in entries])

    def up(self, timeout: float = 120.0) -> None:
        self.testnet.up(wait_height=1, timeout=timeout)
        for node in self.compute:
            self.testnet.start_node(node)
        self.wait_registered(self.compute, timeout)

    def start_compute(self, node: NodeSpec, extra_env: dict[str, str] | None = None) -> None:
        self.testnet.start_node(node, extra_env)

    def wait_registered(self, nodes: list[NodeSpec], timeout: float) -> None:
        """Wait until every node in `nodes` is registered as compute with its stake bonded."""
        deadline = time.monotonic() + timeout
        waiting = list(nodes)
        while waiting:
            dead = [n.name for n in waiting if not self.testnet.is_running(n)]
            if dead:
                raise TestnetError(f"compute node(s) {', '.join(dead)} exited; see {self.testnet.root}/<node>/node.log")
            try:
                waiting = [n for n in waiting if not self._registered(n)]
            except (LedgerUnavailable, RpcAnswerError):
                pass
            if waiting and time.monotonic() > deadline:
                raise TestnetError(f"compute nodes not registered after {timeout:g} s: {[n.name for n in waiting]}")
            time.sleep(0.3)

    def _registered(self, node: NodeSpec) -> bool:
        info = jsonrpc.call(self.rpc_url, "dkb_getNode", node.peer_id)
        stake = jsonrpc.call(self.rpc_url, "dkb_getStake", node.peer_id)
        return info is not None and "compute" in info["roles"] and stake["bonded"] > 0

    def down(self, timeout: float = 10.0) -> list[str]:
        """SIGTERM every running node at once (exiting takes seconds per process once torch is
        loaded), wait for all, SIGKILL those still running after `timeout`; returns their names."""
        running = [n for n in self.compute + self.testnet.nodes if self.testnet.is_running(n)]
        for node in running:
            self.testnet.signal_node(node, signal.SIGCONT)
            self.testnet.signal_node(node, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(self.testnet.is_running(n) for n in running) and time.monotonic() < deadline:
            time.sleep(0.1)
        for node in running:
            if self.testnet.is_running(node):
                self.testnet.kill_node(node)
        return [n.name for n in running]

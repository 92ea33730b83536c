"""A local testnet: genesis, validator homes and the validator processes on 127.0.0.1 (or on the
address given as ``host``, e.g. a public host of an emulated internet).

``Testnet.create(root, validators=N)`` writes ``root/genesis.json``, a funded ``root/faucet_key.json``,
and ``root/vI/`` per validator (``node_key.json``, ``config.toml`` with unique p2p/RPC ports and
every other validator as bootstrap peer, a copy of the genesis), plus ``root/testnet.json`` (the
manifest). ``start_node``/``stop_node``/``kill_node`` manage one process each (``vI/node.pid``,
log in ``vI/node.log``); ``up``/``down`` do all of them. Processes run ``python -m cli.main start``
in their own session, so they outlive the command that started them; a pid is only signalled
while ``/proc/<pid>/cmdline`` still names that node's home.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consensus.genesis import Genesis, GenesisValidator, Params
from node.config import load_config
from node.identity import Identity
from node.keystore import KEY_FILE_NAME, load_identity, save_identity
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError

MANIFEST = "testnet.json"
FAUCET_KEY = "faucet_key.json"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STAKE = 1_000_000
DEFAULT_FAUCET = 10**15


class TestnetError(Exception):
    """The testnet cannot be created, started or reached; the message says why."""


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class NodeSpec:
    name: str
    home: Path
    peer_id: str
    p2p_port: int
    rpc_port: int
    host: str = "127.0.0.1"   # the address the node listens on (p2p and RPC)

    @property
    def rpc_url(self) -> str:
        return f"http://{self.host}:{self.rpc_port}"

    @property
    def p2p_addr(self) -> str:
        return f"/ip4/{self.host}/tcp/{self.p2p_port}/p2p/{self.peer_id}"

    @property
    def pid_file(self) -> Path:
        return self.home / "node.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "node.log"


class Testnet:
    __test__ = False  # not a pytest test class
    def __init__(self, root: Path, chain_id: str, nodes: list[NodeSpec]):
        self.root = root
        self.chain_id = chain_id
        self.nodes = nodes
        self.launchers: dict[str, tuple[str, ...]] = {}   # node name -> command its process starts under
        self._procs: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(cls, root: Path | str, validators: int = 4, *, chain_id: str = "dekube-testnet",
               balances: dict[str, int] | None = None, params: dict[str, Any] | None = None,
               settings: dict[str, str] | None = None, stake: int = DEFAULT_STAKE, base_port: int = 0,
               host: str = "127.0.0.1", hosts: list[str] | None = None) -> Testnet:
        """Write genesis, faucet key and validator homes. ``balances``: extra funded accounts;
        ``params``: genesis params overrides; ``settings``: config overrides "section.key" -> text;
        ``base_port``: node I listens on base_port + 2I (p2p) and base_port + 2I + 1 (RPC); 0: free ports
        (free on 127.0.0.1); ``host``: the IPv4 address every validator listens on; ``hosts``: one address per
        validator instead (each in a namespace of its own, e.g. ``WanLab``'s hosts; needs ``base_port``)."""
        root = Path(root).expanduser()
        if (root / MANIFEST).exists():
            raise TestnetError(f"{root} already holds a testnet (use it, or remove the directory)")
        if validators < 1:
            raise TestnetError("a testnet needs at least one validator")
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        idents = [Identity.generate() for _ in range(validators)]
        faucet = Identity.generate()
        if hosts is not None and (len(hosts) != validators or not base_port):
            raise TestnetError("hosts needs one address per validator and a base port")
        if base_port and not 1024 <= base_port <= 65535 - 2 * validators:
            raise TestnetError(f"base port {base_port} leaves no room for {2 * validators} ports")
        ports = list(range(base_port, base_port + 2 * validators)) if base_port else free_ports(2 * validators)
        nodes = [NodeSpec(f"v{i}", root / f"v{i}", ident.peer_id, ports[2 * i], ports[2 * i + 1],
                          hosts[i] if hosts is not None else host)
                 for i, ident in enumerate(idents)]
        funded = {faucet.peer_id: DEFAULT_FAUCET, **{n.peer_id: 10**9 for n in nodes}, **(balances or {})}
        genesis = Genesis(chain_id, int(time.time() * 1000), funded,
                          tuple(GenesisValidator(n.peer_id, stake, (n.p2p_addr,)) for n in nodes),
                          Params(**{"committee_size": validators, **(params or {})}))
        genesis_text = genesis.to_json()
        (root / "genesis.json").write_text(genesis_text)
        save_identity(root / FAUCET_KEY, faucet)
        for node, ident in zip(nodes, idents):
            node.home.mkdir(mode=0o700, exist_ok=True)
            save_identity(node.home / KEY_FILE_NAME, ident)
            (node.home / "genesis.json").write_text(genesis_text)
            overrides = {
                ("node", "roles"): "validator",
                ("p2p", "listen"): f"/ip4/{node.host}/tcp/{node.p2p_port}",
                ("p2p", "bootstrap"): ",".join(o.p2p_addr for o in nodes if o is not node),
                ("rpc", "host"): node.host,
                ("rpc", "port"): str(node.rpc_port),
                ("consensus", "chain_id"): chain_id,
            }
            for name, value in (settings or {}).items():
                section, _, key = name.partition(".")
                overrides[(section, key)] = value
            (node.home / "config.toml").write_text(load_config(None, env={}, overrides=overrides).to_toml())
        manifest = {"chain_id": chain_id, "nodes": [
            {"name": n.name, "peer_id": n.peer_id, "p2p_port": n.p2p_port, "rpc_port": n.rpc_port, "host": n.host}
            for n in nodes]}
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
        return cls(root, chain_id, nodes)

    @classmethod
    def load(cls, root: Path | str) -> Testnet:
        root = Path(root).expanduser()
        try:
            manifest = json.loads((root / MANIFEST).read_text())
            nodes = [NodeSpec(n["name"], root / n["name"], n["peer_id"], n["p2p_port"], n["rpc_port"],
                              n.get("host", "127.0.0.1")) for n in manifest["nodes"]]
            return cls(root, manifest["chain_id"], nodes)
        except FileNotFoundError:
            raise TestnetError(
                f"no testnet in {root} (create one with 'dekube-node testnet up --home {root}')") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise TestnetError(f"{root / MANIFEST} is damaged: {exc}") from None

    @property
    def faucet_key(self) -> Path:
        return self.root / FAUCET_KEY

    def faucet(self) -> Identity:
        return load_identity(self.faucet_key)

    def genesis(self) -> Genesis:
        return Genesis.from_json((self.root / "genesis.json").read_text())

    # ------------------------------------------------------------------ processes
    def pid(self, node: NodeSpec) -> int | None:
        """The pid of ``node``'s running process, or None (stale pid files are ignored)."""
        proc = self._procs.get(node.name)
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        try:
            pid = int(node.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        return pid if str(node.home).encode() in cmdline and state != "Z" else None

    def is_running(self, node: NodeSpec) -> bool:
        return self.pid(node) is not None

    def start_node(self, node: NodeSpec, extra_env: dict[str, str] | None = None) -> int:
        """Start ``node``'s process (under its ``launchers`` entry, e.g. ``ip netns exec NS``); its pid."""
        if self.is_running(node):
            return self.pid(node)
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               **(extra_env or {})}
        with open(node.log_file, "ab") as log:
            argv = [*self.launchers.get(node.name, ()), sys.executable, "-m", "cli.main", "start", "--home",
                    str(node.home)]
            proc = subprocess.Popen(argv,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=str(REPO_ROOT), start_new_session=True)
        self._procs[node.name] = proc
        node.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid

    def signal_node(self, node: NodeSpec, signum: int) -> bool:
        pid = self.pid(node)
        if pid is None:
            return False
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return False
        return True

    def kill_node(self, node: NodeSpec) -> None:
        """kill -9, and reap it."""
        self.signal_node(node, signal.SIGKILL)
        self._wait_exit(node, 10.0)

    def stop_node(self, node: NodeSpec, timeout: float = 10.0) -> bool:
        """SIGTERM (after SIGCONT, in case it is stopped), then SIGKILL after ``timeout``; True if it was running."""
        if not self.is_running(node):
            return False
        self.signal_node(node, signal.SIGCONT)
        self.signal_node(node, signal.SIGTERM)
        if not self._wait_exit(node, timeout):
            self.signal_node(node, signal.SIGKILL)
            self._wait_exit(node, 5.0)
        return True

    def _wait_exit(self, node: NodeSpec, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        proc = self._procs.get(node.name)
        while time.monotonic() < deadline:
            if proc is not None:
                try:
                    proc.wait(timeout=0.05)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not self.is_running(node):
                return True
            time.sleep(0.05)
        return not self.is_running(node)

    def up(self, wait_height: int = 2, timeout: float = 60.0) -> None:
        for node in self.nodes:
            self.start_node(node)
        if wait_height > 0:
            self.wait_height(wait_height, timeout)

    def down(self, timeout: float = 10.0) -> list[str]:
        return [node.name for node in self.nodes if self.stop_node(node, timeout)]

    # ------------------------------------------------------------------ observation
    def height(self, node: NodeSpec, timeout: float = 2.0) -> int | None:
        try:
            return jsonrpc.call(node.rpc_url, "dkb_blockNumber", timeout=timeout)
        except (LedgerUnavailable, RpcAnswerError):
            return None

    def wait_height(self, height: int, timeout: float, nodes: list[NodeSpec] | None = None) -> None:
        """Wait until every node in ``nodes`` (default all) has committed ``height``."""
        nodes = self.nodes if nodes is None else nodes
        deadline = time.monotonic() + timeout
        while True:
            heights = {n.name: self.height(n) for n in nodes}
            if all(h is not None and h >= height for h in heights.values()):
                return
            dead = [n.name for n in nodes if not self.is_running(n)]
            if dead:
                raise TestnetError(f"node(s) {', '.join(dead)} exited; see {nodes[0].home.parent}/<node>/node.log")
            if time.monotonic() > deadline:
                raise TestnetError(f"timed out waiting for height {height}: {heights}")
            time.sleep(0.2)

    def status(self, extra_nodes: Iterable[NodeSpec] = ()) -> list[dict[str, Any]]:
        """Pid, height and RPC URL of every validator, plus any other nodes of this network."""
        return [{"name": n.name, "pid": self.pid(n), "height": self.height(n) if self.is_running(n) else None,
                 "rpc": n.rpc_url, "peer_id": n.peer_id} for n in [*self.nodes, *extra_nodes]]

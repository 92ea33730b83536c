"""The network a manifest names: validator, relay and compute homes, each node in its own network
namespace (``netns`` mode) or all on 127.0.0.1 (``loopback``), plus the handles perturbations use.

``PerturbNet.create(root, manifest, mode)`` writes genesis and every home (validators as
``devtools.testnet`` lays them out, so ``Testnet.load`` reads them; relays ``rI`` and compute nodes
``cI`` like ``devtools.devnet``), mounts a tmpfs of ``disk_mib`` as the data dir of each of
``disk_nodes``, and returns the handle; ``close()`` kills every node and removes namespaces,
firewall table and mounts.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from consensus.genesis import Genesis, GenesisValidator, Params
from devtools.devnet import COMPUTE_FUNDS, quiet_ports
from devtools.netlab.isolation import LoopbackFirewall, NetnsLab
from devtools.perturb.manifest import Manifest
from devtools.testnet import DEFAULT_FAUCET, DEFAULT_STAKE, FAUCET_KEY, MANIFEST, NodeSpec, Testnet
from node.config import load_config
from node.identity import Identity
from node.keystore import KEY_FILE_NAME, save_identity
from node.ledger import jsonrpc
from node.ledger.errors import LedgerUnavailable, RpcAnswerError

P2P_PORT, RPC_PORT = 4001, 8645   # every node's ports in netns mode (each has its own address)


@dataclass
class Member:
    spec: NodeSpec
    role: str                     # validator | relay | compute
    launcher: tuple[str, ...] = ()
    disk: Path | None = None      # tmpfs data dir (disk-full perturbations)

    @property
    def name(self) -> str:
        return self.spec.name


class LaunchingTestnet(Testnet):
    """``Testnet`` whose nodes start under a per-node launcher (``ip netns exec NS``)."""
    __test__ = False

    def __init__(self, root: Path, chain_id: str, nodes: list[NodeSpec], launchers: dict[str, tuple[str, ...]]):
        super().__init__(root, chain_id, nodes)
        self.launchers = launchers

    def exit_code(self, node: NodeSpec) -> int | None:
        proc = self._procs.get(node.name)
        return None if proc is None else proc.poll()


def _write_config(home: Path, overrides: dict[tuple[str, str], str]) -> None:
    (home / "config.toml").write_text(load_config(None, env={}, overrides=overrides).to_toml())


class PerturbNet:
    def __init__(self, root: Path, testnet: LaunchingTestnet, members: list[Member],
                 lab: NetnsLab | None, firewall: LoopbackFirewall | None):
        self.root = root
        self.testnet = testnet
        self.members = members
        self.lab = lab
        self.firewall = firewall

    @property
    def validators(self) -> list[Member]:
        return [m for m in self.members if m.role == "validator"]

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(cls, root: Path, manifest: Manifest, mode: str, prefix: str, nft: bool,
               accounts: list[Identity], log_level: str = "warning") -> PerturbNet:
        """``mode``: netns or loopback (resolved by the caller); ``nft``: set up the loopback firewall."""
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        chain_id = f"dekube-{manifest.name}"[:64]
        names = ([f"v{i}" for i in range(manifest.validators)] + [f"r{i}" for i in range(manifest.relays)]
                 + [f"c{i}" for i in range(manifest.compute)])
        roles = {n: {"v": "validator", "r": "relay", "c": "compute"}[n[0]] for n in names}
        lab = firewall = None
        try:
            if mode == "netns":
                lab = NetnsLab(prefix)
                hosts = {n: lab.add(n) for n in names}
                ports = {n: (P2P_PORT, RPC_PORT) for n in names}
            else:
                hosts = dict.fromkeys(names, "127.0.0.1")
                picked = quiet_ports(2 * len(names))
                ports = {n: (picked[2 * i], picked[2 * i + 1]) for i, n in enumerate(names)}
                firewall = LoopbackFirewall(prefix) if nft else None
            idents = {n: Identity.generate() for n in names}
            specs = {n: NodeSpec(n, root / n, idents[n].peer_id, ports[n][0], ports[n][1], hosts[n]) for n in names}
            vals = [specs[n] for n in names if roles[n] == "validator"]
            faucet = Identity.generate()
            funded = {faucet.peer_id: DEFAULT_FAUCET, **{v.peer_id: 10**9 for v in vals},
                      **{specs[n].peer_id: COMPUTE_FUNDS for n in names if roles[n] != "validator"},
                      **{a.peer_id: 10**12 for a in accounts}}
            genesis = Genesis(chain_id, int(time.time() * 1000), funded,
                              tuple(GenesisValidator(v.peer_id, DEFAULT_STAKE, (v.p2p_addr,)) for v in vals),
                              Params(committee_size=len(vals)))
            genesis_text = genesis.to_json()
            (root / "genesis.json").write_text(genesis_text)
            save_identity(root / FAUCET_KEY, faucet)
            relays = [specs[n] for n in names if roles[n] == "relay"]
            rpc_urls = ",".join(v.rpc_url for v in vals)
            members = []
            for n in names:
                spec, role = specs[n], roles[n]
                spec.home.mkdir(mode=0o700, exist_ok=True)
                save_identity(spec.home / KEY_FILE_NAME, idents[n])
                overrides = {
                    ("node", "roles"): role,
                    ("node", "log_level"): log_level,
                    ("p2p", "listen"): f"/ip4/{spec.host}/tcp/{spec.p2p_port}",
                    ("p2p", "bootstrap"): ",".join(v.p2p_addr for v in vals if v is not spec),
                    ("rpc", "host"): spec.host,
                    ("rpc", "port"): str(spec.rpc_port),
                    ("consensus", "chain_id"): chain_id,
                }
                if role == "validator":
                    (spec.home / "genesis.json").write_text(genesis_text)
                else:
                    overrides[("ledger", "rpc_urls")] = rpc_urls
                if role == "relay":
                    overrides[("relay", "allow_list")] = ",".join(s.peer_id for s in specs.values() if s is not spec)
                elif relays:
                    overrides[("relay", "relays")] = ",".join(r.p2p_addr for r in relays)
                    overrides[("relay", "reserve")] = "true"
                if role == "compute":
                    overrides[("compute", "rpc_url")] = vals[int(n[1:]) % len(vals)].rpc_url
                _write_config(spec.home, overrides)
                member = Member(spec, role, tuple(lab.launcher(n)) if lab else ())
                if n in manifest.disk_nodes:
                    member.disk = spec.home / "data"
                    member.disk.mkdir(mode=0o700)
                    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={manifest.disk_mib}m,mode=0700",
                                    f"{prefix}-{n}", str(member.disk)], check=True, capture_output=True)
                members.append(member)
            (root / MANIFEST).write_text(json.dumps({"chain_id": chain_id, "nodes": [
                {"name": v.name, "peer_id": v.peer_id, "p2p_port": v.p2p_port, "rpc_port": v.rpc_port,
                 "host": v.host} for v in vals]}, indent=2))
        except BaseException:
            for path in (root / n / "data" for n in manifest.disk_nodes):
                subprocess.run(["umount", str(path)], capture_output=True)
            if lab:
                lab.close()
            if firewall:
                firewall.close()
            raise
        testnet = LaunchingTestnet(root, chain_id, vals, {m.name: m.launcher for m in members})
        return cls(root, testnet, members, lab, firewall)

    # ------------------------------------------------------------------ processes
    def start(self, member: Member) -> None:
        self.testnet.start_node(member.spec)

    def kill(self, member: Member) -> None:
        self.testnet.kill_node(member.spec)

    def signal(self, member: Member, signum: int) -> bool:
        return self.testnet.signal_node(member.spec, signum)

    def stop(self, member: Member, timeout: float) -> bool:
        """SIGTERM and wait up to ``timeout``; True if it exited by itself (else its stacks are dumped
        next to its log when py-spy is installed, and it is SIGKILLed)."""
        self.testnet.signal_node(member.spec, signal.SIGCONT)
        self.testnet.signal_node(member.spec, signal.SIGTERM)
        if self.testnet._wait_exit(member.spec, timeout):
            return True
        self.dump_stacks(member, "sigterm-hang")
        self.kill(member)
        return False

    def dump_stacks(self, member: Member, why: str) -> Path | None:
        """``py-spy dump`` of the node's threads (and asyncio tasks' frames) into its home; None without py-spy."""
        pid = self.testnet.pid(member.spec)
        if pid is None or shutil.which("py-spy") is None:
            return None
        out = member.spec.home / f"stacks-{why}-{int(time.time())}.txt"
        with open(out, "w") as fh:
            subprocess.run(["py-spy", "dump", "--locals", "--pid", str(pid)], stdout=fh, stderr=subprocess.STDOUT,
                           timeout=60)
        return out

    def running(self, member: Member) -> bool:
        return self.testnet.is_running(member.spec)

    def exit_code(self, member: Member) -> int | None:
        return self.testnet.exit_code(member.spec)

    def height(self, member: Member, timeout: float = 2.0) -> int | None:
        return self.testnet.height(member.spec, timeout)

    def healthy(self, member: Member, timeout: float = 2.0) -> bool:
        try:
            return bool(jsonrpc.call(member.spec.rpc_url, "dkb_health", timeout=timeout).get("ok"))
        except (LedgerUnavailable, RpcAnswerError, AttributeError):
            return False

    def up(self, timeout: float) -> None:
        for member in self.members:
            if member.role == "validator":
                self.start(member)
        self.testnet.wait_height(2, timeout)
        others = [m for m in self.members if m.role != "validator"]
        for member in others:
            self.start(member)
        deadline = time.monotonic() + timeout
        for member in others:
            while not self.healthy(member):
                if not self.running(member):
                    raise RuntimeError(f"{member.name} exited at start; see {member.spec.log_file}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{member.name} not healthy after {timeout:g} s; see {member.spec.log_file}")
                time.sleep(0.3)

    def close(self) -> None:
        for member in self.members:
            self.signal(member, signal.SIGCONT)
            self.kill(member)
        for member in self.members:
            if member.disk is not None:
                subprocess.run(["umount", "-l", str(member.disk)], capture_output=True)
        if self.lab:
            self.lab.close()
        if self.firewall:
            self.firewall.close()

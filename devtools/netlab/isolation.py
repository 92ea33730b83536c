"""Cutting one node's network: a namespace per node on a private bridge (take its link down), or on
plain loopback an nftables rule dropping its p2p port; ``probe_isolation`` says which one works here.

``NetnsLab(prefix)``: a bridge ``<prefix>br`` with 10.231.N.1/24 in the root namespace and, per node,
a namespace ``<prefix>-<name>`` joined by a veth pair (root side ``<prefix>h<i>`` on the bridge);
``cut``/``restore`` set the root side down/up, which silences every connection of that node at
once (peers see a partition, as with ``docker network disconnect``). ``LoopbackFirewall(prefix)``:
an nftables table whose input chain drops TCP to and from a node's port. Both need root; every
name starts with the run's prefix and ``close`` removes all of it.
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess


class IsolationError(RuntimeError):
    """A namespace, link or firewall command failed; the message has the command and its stderr."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise IsolationError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


def probe_isolation(prefix: str) -> dict[str, str | None]:
    """Which isolation works here: {"netns": None or why not, "nft": None or why not}."""
    why: dict[str, str | None] = {"netns": None, "nft": None}
    if os.geteuid() != 0:
        return {"netns": "not root", "nft": "not root"}
    if shutil.which("ip") is None:
        why["netns"] = "no ip command (iproute2)"
    else:
        name = f"{prefix}-probe"
        done = _run("ip", "netns", "add", name, check=False)
        if done.returncode != 0:
            why["netns"] = f"ip netns add failed: {done.stderr.strip()}"
        else:
            _run("ip", "netns", "del", name, check=False)
    if shutil.which("nft") is None:
        why["nft"] = "no nft command (nftables)"
    else:
        done = _run("nft", "add", "table", "inet", f"{prefix}probe", check=False)
        if done.returncode != 0:
            why["nft"] = f"nft add table failed: {done.stderr.strip()}"
        else:
            _run("nft", "delete", "table", "inet", f"{prefix}probe", check=False)
    return why


def _free_subnet() -> int:
    used = _run("ip", "-4", "route", "show").stdout
    for _ in range(100):
        n = random.randrange(0, 256)
        if f"10.231.{n}." not in used:
            return n
    raise IsolationError("no free 10.231.N.0/24 subnet for the bridge")


class NetnsLab:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.bridge = f"{prefix}br"
        self.subnet = _free_subnet()
        self.namespaces: dict[str, str] = {}   # node name -> namespace
        self.links: dict[str, str] = {}        # node name -> root-side veth
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        # bridged frames must not go through the host's iptables (br_netfilter may be loaded)
        _run("ip", "link", "set", self.bridge, "type", "bridge", "nf_call_iptables", "0", check=False)
        _run("ip", "addr", "add", f"10.231.{self.subnet}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def add(self, name: str) -> str:
        """A namespace for node ``name`` joined to the bridge; returns the node's IPv4 address."""
        index = len(self.namespaces)
        ns, host_end, node_end = f"{self.prefix}-{name}", f"{self.prefix}h{index}", f"{self.prefix}p{index}"
        address = f"10.231.{self.subnet}.{index + 2}"
        _run("ip", "netns", "add", ns)
        self.namespaces[name] = ns
        _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
        self.links[name] = host_end
        _run("ip", "link", "set", node_end, "netns", ns)
        _run("ip", "link", "set", host_end, "master", self.bridge)
        _run("ip", "link", "set", host_end, "up")
        _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", node_end)
        _run("ip", "-n", ns, "link", "set", node_end, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        return address

    def launcher(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[name]]

    def cut(self, name: str) -> None:
        _run("ip", "link", "set", self.links[name], "down")

    def restore(self, name: str) -> None:
        _run("ip", "link", "set", self.links[name], "up")

    def close(self) -> None:
        for link in self.links.values():
            _run("ip", "link", "del", link, check=False)
        for ns in self.namespaces.values():
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)


class LoopbackFirewall:
    def __init__(self, prefix: str):
        self.table = f"{prefix}fw"
        _run("nft", "add", "table", "inet", self.table)
        _run("nft", "add", "chain", "inet", self.table, "cut",
             "{ type filter hook input priority 0 ; policy accept ; }")

    def cut(self, port: int) -> None:
        for direction in ("dport", "sport"):
            _run("nft", "add", "rule", "inet", self.table, "cut", "tcp", direction, str(port), "drop")

    def restore(self) -> None:
        _run("nft", "flush", "chain", "inet", self.table, "cut")

    def close(self) -> None:
        _run("nft", "delete", "table", "inet", self.table, check=False)

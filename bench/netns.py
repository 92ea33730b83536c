"""A small network lab for benchmarks: N peer namespaces on one bridge, each link shaped by tc tbf.

Needs root and iproute2. Peer i lives in namespace `<prefix>p<i>` with interface `<prefix>a<i>`
and address 10.<subnet>.0.<i+1>/24; the other end of its veth sits on a bridge inside the hub
namespace `<prefix>hub`, so nothing is added to the host's own namespace. Both directions of every
link are shaped with `tbf` (upload on the peer side, download on the hub side). Names carry a
per-process prefix, and `Netlab` always tears everything down on exit (also at interpreter exit).
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess


class NetlabError(RuntimeError):
    """The lab could not be built (not root, no iproute2, or a command failed)."""


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetlabError(f"{' '.join(cmd)}: {proc.stderr.strip()}")


def available() -> str | None:
    """None if a lab can be built here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return None


class Netlab:
    def __init__(self, peers: int, rate_mbit: float = 100.0, subnet: int = 77, prefix: str | None = None):
        if not 1 <= peers <= 200:
            raise ValueError("1..200 peers")
        self.peers = peers
        self.rate_mbit = rate_mbit
        self.subnet = subnet
        self.prefix = prefix or f"dk{os.getpid() % 100000}"
        self.hub = f"{self.prefix}hub"
        self._created: list[str] = []

    def ns(self, i: int) -> str:
        return f"{self.prefix}p{i}"

    def ifname(self, i: int) -> str:
        return f"{self.prefix}a{i}"

    def address(self, i: int) -> str:
        return f"10.{self.subnet}.0.{i + 1}"

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command line to run it inside peer i's namespace."""
        return ["ip", "netns", "exec", self.ns(i)]

    def __enter__(self) -> Netlab:
        why = available()
        if why:
            raise NetlabError(why)
        atexit.register(self.teardown)
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _build(self) -> None:
        rate = f"{self.rate_mbit:g}mbit"
        # burst must hold a full GSO segment (64 KiB); latency bounds the queue
        tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"]
        _ip("ip", "netns", "add", self.hub)
        self._created.append(self.hub)
        _ip("ip", "link", "set", "lo", "up", ns=self.hub)
        _ip("ip", "link", "add", "br0", "type", "bridge", ns=self.hub)
        _ip("ip", "link", "set", "br0", "up", ns=self.hub)
        for i in range(self.peers):
            ns, inner, outer = self.ns(i), self.ifname(i), f"{self.prefix}b{i}"
            _ip("ip", "netns", "add", ns)
            self._created.append(ns)
            _ip("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("ip", "link", "set", inner, "netns", ns)
            _ip("ip", "link", "set", outer, "netns", self.hub)
            _ip("ip", "link", "set", "lo", "up", ns=ns)
            _ip("ip", "addr", "add", f"{self.address(i)}/24", "dev", inner, ns=ns)
            _ip("ip", "link", "set", inner, "up", ns=ns)
            _ip("ip", "link", "set", outer, "master", "br0", ns=self.hub)
            _ip("ip", "link", "set", outer, "up", ns=self.hub)
            _ip("tc", "qdisc", "add", "dev", inner, *tbf, ns=ns)
            _ip("tc", "qdisc", "add", "dev", outer, *tbf, ns=self.hub)

    def teardown(self) -> None:
        """Delete every namespace this lab made (their veths and the bridge go with them)."""
        while self._created:
            subprocess.run(["ip", "netns", "del", self._created.pop()], capture_output=True)

    def tx_bytes(self, i: int) -> int:
        out = subprocess.run([*self.exec_prefix(i), "cat", f"/sys/class/net/{self.ifname(i)}/statistics/tx_bytes"],
                             capture_output=True, text=True, check=True)
        return int(out.stdout)

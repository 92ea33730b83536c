"""A WAN of hosts in network namespaces: every pair of hosts has its own one-way delay.

``WanLab().build(matrix)`` makes one namespace per host (``<p>v<i>``, ``eth0`` = 10.98.0.<10+i>/24)
and a wire namespace ``<p>sw`` holding the other end of every host's veth, where one
``delay_switch.py`` process forwards each frame from host i to host j ``matrix[i][j]`` ms later
(CometBFT's QA method, per-link ``tc`` delays from an inter-region table; netem does not exist in
this kernel, so the delay is in userspace). Hosts cap GSO so frames fit the MTU. ``teardown`` (also
at exit and on SIGTERM, from ``Lab``) stops the switch and deletes the namespaces.
"""
from __future__ import annotations

import atexit
import subprocess
import sys
from pathlib import Path

from .lab import Lab, LabError, _exit_on_sigterm, run, sweep_stale_labs, unavailable

WAN_NET = "10.98.0"
DELAY_SWITCH = Path(__file__).resolve().parent / "delay_switch.py"


class WanLab(Lab):
    """Hosts joined by a delay switch; ``hosts[i]`` is host i's address, ``ns(i)`` its namespace."""

    hosts: list[str]

    def build_wan(self, matrix: list[list[float]]) -> WanLab:
        size = len(matrix)
        if size < 2 or size > 200 or any(len(row) != size or min(row) < 0 for row in matrix):
            raise ValueError("the delay matrix must be N x N (2 <= N <= 200) with delays >= 0")
        why = unavailable(nat=False)
        if why:
            raise LabError(why)
        sweep_stale_labs()
        atexit.register(self.teardown)
        _exit_on_sigterm()
        self.hosts = []
        try:
            wire = self._add_ns(self.ns_of("sw"))
            for i in range(size):
                ns = self._add_ns(self.ns(i))
                ip = f"{WAN_NET}.{10 + i}"
                run("ip", "link", "add", "eth0", "type", "veth", "peer", "name", f"s{i}", "netns", wire, ns=ns)
                run("ip", "link", "set", "eth0", "gso_max_segs", "1", "up", ns=ns)
                run("ip", "addr", "add", f"{ip}/24", "dev", "eth0", ns=ns)
                run("ip", "link", "set", f"s{i}", "up", ns=wire)
                self.hosts.append(ip)
            proc = subprocess.Popen(["ip", "netns", "exec", wire, sys.executable, str(DELAY_SWITCH),
                                     _matrix_arg(matrix), *(f"s{i}" for i in range(size))],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._processes.append(proc)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "READY":
                raise LabError(f"the delay switch in {wire} did not start (rc={proc.poll()})")
        except BaseException:
            self.teardown()
            raise
        return self

    def ns(self, i: int) -> str:
        return self.ns_of(f"v{i}")


def _matrix_arg(matrix: list[list[float]]) -> str:
    return "[" + ",".join("[" + ",".join(f"{v:g}" for v in row) + "]" for row in matrix) + "]"

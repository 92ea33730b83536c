"""A shaped star for benchmarks: N peers as public hosts on the lab's backbone, each link capped by
``tc tbf`` in both directions (upload on the peer's ``eth0``, download on its bridge port).

``Star(peers, rate_mbit)`` is a context manager over a ``lab.Lab`` (unique namespace prefix, torn
down on exit and at interpreter exit); peer i lives in namespace ``ns(i)`` with ``address(i)`` on
``ifname(i)``, and ``exec_prefix(i)`` runs a command line there. Needs root, iproute2 and tc (no nftables).
"""
from __future__ import annotations

from .lab import BACKBONE_NET, Lab, LabError, run, shape, unavailable

QUEUE_LATENCY = "100ms"   # tbf queue bound on the star's links (the benchmarks' figures use it)


class Star:
    def __init__(self, peers: int, rate_mbit: float = 100.0):
        if not 1 <= peers <= 200:
            raise ValueError("1..200 peers")
        self.peers = peers
        self.rate_mbit = rate_mbit
        self.lab = Lab()

    def ns(self, i: int) -> str:
        return self.lab.ns_of(f"p{i}")

    def ifname(self, i: int) -> str:
        return "eth0"

    def address(self, i: int) -> str:
        return self.lab.public[f"p{i}"]

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command line to run it inside peer i's namespace."""
        return ["ip", "netns", "exec", self.ns(i)]

    def __enter__(self) -> Star:
        why = unavailable(nat=False)
        if why:
            raise LabError(why)
        self.lab.build([], [])
        try:
            for i in range(self.peers):
                port = self.lab.add_public(f"p{i}", f"{BACKBONE_NET}.{10 + i}")
                shape(self.ns(i), "eth0", self.rate_mbit, QUEUE_LATENCY)
                shape(self.lab.backbone, port, self.rate_mbit, QUEUE_LATENCY)
        except BaseException:
            self.lab.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.lab.teardown()

    def tx_bytes(self, i: int) -> int:
        """Bytes peer i has sent on its link."""
        return int(run("cat", f"/sys/class/net/{self.ifname(i)}/statistics/tx_bytes", ns=self.ns(i)))

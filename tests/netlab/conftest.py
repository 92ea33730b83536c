"""The netlab fixture: one emulated internet per test module, with agents on it, always torn down.

Public hosts ``relay1``, ``relay2``, ``pub`` (10.99.0.10-12); home 1 and home 2 behind
endpoint-independent NATs, home 3 behind a symmetric NAT; agents ``a`` (home 1), ``b`` (home 2),
``c`` (home 3) and ``pub``; relays ``relay1``/``relay2`` admit a, b, c and pub. Skips with the
reason when the machine cannot build namespaces.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest

from .lab import Lab, unavailable
from .nodes import Node, peer_id_of

PORT = 4001
REGISTERED = ("a", "b", "c", "pub")
PUNCH = ("--punch-attempts", "2", "--punch-window", "3")


@dataclass
class Net:
    lab: Lab
    nodes: dict[str, Node] = field(default_factory=dict)

    def start_relay(self, name: str, host: str, port: int = PORT) -> Node:
        allow = ",".join(peer_id_of(n) for n in REGISTERED)
        node = Node.start(name, self.lab.ns_of(host), f"/ip4/{self.lab.public[host]}/tcp/{port}",
                          "--relay", "--allow", allow)
        self.nodes[name] = node
        return node

    def start_home(self, name: str, home: int, port: int = PORT) -> Node:
        record = self.lab.homes[home - 1]
        node = Node.start(name, record.ns, f"/ip4/{record.ip}/tcp/{port}", *PUNCH)
        self.nodes[name] = node
        return node

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def close(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.stop()


@pytest.fixture(scope="module")
def net():
    why = unavailable()
    if why:
        pytest.skip(why)
    lab = Lab().build(["relay1", "relay2", "pub"], ["eim", "eim", "symmetric"])
    network = Net(lab)
    try:
        network.start_relay("relay1", "relay1")
        network.start_relay("relay2", "relay2")
        network.nodes["pub"] = Node.start("pub", lab.ns_of("pub"), f"/ip4/{lab.public['pub']}/tcp/{PORT}")
        for name, home in (("a", 1), ("b", 2), ("c", 3)):
            network.start_home(name, home)
        yield network
    finally:
        network.close()
        lab.teardown()

"""The standard netlab layout with its agents, for the tests (conftest.py) and bench/relay.py.

Public hosts ``relay1``, ``relay2``, ``pub`` (10.99.0.10-12); home 1 and home 2 behind
endpoint-independent NATs, home 3 behind a symmetric NAT, home 4 behind an endpoint-independent NAT
on a link with FAR_HOME_DELAY_MS of latency each way; public host ``far`` (10.99.0.20) sits
behind FAR_RELAY_DELAY_MS each way. Relay agents admit the peers named in
``REGISTERED``; agents are started on demand and all stopped by ``close``. ``start_home_node``
runs a real Node (``node_agent.py``) in a home instead of a bare agent.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from .lab import BACKBONE_NET, Lab
from .nodes import NODE_AGENT, Node, peer_id_of

PORT = 4001
REGISTERED = ("a", "b", "c", "d", "e", "g", "pub", "na", "nb", "nc")
FAR_HOME_DELAY_MS = 25.0   # home 4's WAN link: one way, each direction
FAR_RELAY_DELAY_MS = 20.0  # the public host "far" (a distant relay)
PUNCH = ("--punch-attempts", "2", "--punch-window", "3")


@dataclass
class Net:
    lab: Lab
    nodes: dict[str, Node] = field(default_factory=dict)

    @classmethod
    def build(cls, home_rate_mbit: float = 1000.0) -> Net:
        lab = Lab(home_rate_mbit=home_rate_mbit).build(["relay1", "relay2", "pub"], ["eim", "eim", "symmetric", "eim"],
                                                       [0, 0, 0, FAR_HOME_DELAY_MS])
        try:
            lab.add_public("far", f"{BACKBONE_NET}.20", FAR_RELAY_DELAY_MS)
        except BaseException:
            lab.teardown()
            raise
        return cls(lab)

    def start_relay(self, name: str, host: str, port: int = PORT) -> Node:
        allow = ",".join(peer_id_of(n) for n in REGISTERED)
        node = Node.start(name, self.lab.ns_of(host), f"/ip4/{self.lab.public[host]}/tcp/{port}",
                          "--relay", "--allow", allow)
        self.nodes[name] = node
        return node

    def start_public(self, name: str, host: str, port: int = PORT) -> Node:
        node = Node.start(name, self.lab.ns_of(host), f"/ip4/{self.lab.public[host]}/tcp/{port}")
        self.nodes[name] = node
        return node

    def start_home(self, name: str, home: int, port: int = PORT, *extra: str) -> Node:
        record = self.lab.homes[home - 1]
        node = Node.start(name, record.ns, f"/ip4/{record.ip}/tcp/{port}", *PUNCH, *extra)
        self.nodes[name] = node
        return node

    def start_home_node(self, name: str, home: int, relays: list[str], port: int = PORT, *extra: str) -> Node:
        """A real Node in home ``home`` reserving on ``relays``; READY once it holds a reservation."""
        record = self.lab.homes[home - 1]
        node = Node.start(name, record.ns, f"/ip4/{record.ip}/tcp/{port}", "--relays", ",".join(relays), *extra,
                          agent=NODE_AGENT)
        self.nodes[name] = node
        return node

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def close(self) -> None:
        """Stop every agent, then delete the namespaces."""
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.stop()
        self.lab.teardown()

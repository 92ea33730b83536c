"""A crew of training Nodes in the netlab (bench/training_netlab.py, tests/netlab/test_training_over_nat.py):
a lab with two relays and one home per worker (NATs ``HOME_NATS`` in turn: eim, eim, symmetric, eim),
each home's links capped at ``mbit`` by ``tc tbf`` and its WAN link through a delay line where asked
for; in each home a ``train_agent.py`` Node reserving on both relays.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from .lab import Lab
from .net import PORT, Net
from .nodes import AgentError, Node
from .scenarios import poll

TRAIN_AGENT = "devtools.netlab.train_agent"
WORKERS = ("a", "b", "c", "d")            # homes 1-4 (names the relays admit)
HOME_NATS = ["eim", "eim", "symmetric", "eim"]
SETTLE_S = 10.0                           # a failed punch costs ~8 s before the pair settles on the relay


def start_crew(workers: int, mbit: float, delays_ms: list[float] | None = None) -> tuple[Net, list[Node]]:
    """The lab and its ``workers`` (2-4) training Nodes; close the Net to tear everything down."""
    lab = Lab(home_rate_mbit=mbit).build(["relay1", "relay2"], HOME_NATS[:workers], delays_ms)
    net = Net(lab)
    try:
        net.start_relay("relay1", "relay1")
        net.start_relay("relay2", "relay2")
        relays = ",".join(net[r].addr for r in ("relay1", "relay2"))

        def start(i: int) -> Node:
            home = lab.homes[i]
            return Node.start(WORKERS[i], home.ns, f"/ip4/{home.ip}/tcp/{PORT}", "--relays", relays, agent=TRAIN_AGENT)

        with ThreadPoolExecutor(workers) as pool:
            crew = list(pool.map(start, range(workers)))
        net.nodes.update({node.name: node for node in crew})
        return net, crew
    except BaseException:
        net.close()
        raise


def settle(crew: list[Node]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Connect every pair and let hole punching finish before training: a punch that succeeds retires
    the relayed connection, and a bulk stream on it then resets mid-round (the member is excluded).
    Returns each Node's relayed addresses and each pair's connection kind once every pair holds one."""
    circuits = {node.peer_id: node.call("relayed_addrs") for node in crew}
    for node in crew:
        for other in crew:
            if other is not node:
                _echo(node, other, circuits[other.peer_id])
    time.sleep(SETTLE_S)

    def kinds() -> dict[str, list[str]] | None:
        found = paths(crew)
        return found if all(len(k) == 1 for k in found.values()) else None
    return circuits, poll(kinds, 30, 1.0, "one connection kind per pair")


def _echo(node: Node, other: Node, circuits: list[str], tries: int = 3) -> None:
    """One echo from ``node`` to ``other`` (it connects the pair): tried again when its stream was reset,
    as it is when a hole punch that succeeds meanwhile retires the relayed connection it went over."""
    for attempt in range(tries):
        try:
            node.call("echo", peer=other.peer_id, circuits=circuits, timeout=30)
            return
        except AgentError:
            if attempt == tries - 1:
                raise
            time.sleep(1.0)


def paths(crew: list[Node]) -> dict[str, list[str]]:
    """Each pair's connection kinds now ("direct", "relayed"; both while a punch retires the relay)."""
    return {f"{n.name}-{o.name}": sorted(set(n.call("paths", peer=o.peer_id))) for n in crew for o in crew
            if n.name < o.name}


def train(crew: list[Node], circuits: dict[str, list[str]], spec: dict, timeout: float) -> list[dict]:
    """Every Node prepares ``spec`` (a TrainSpec dict) with the others, then all train it (a start
    barrier); their ``train`` answers by rank."""
    prepared = [node.call_async("prepare", peers={p: c for p, c in circuits.items() if p != node.peer_id}, spec=spec)
                for node in crew]
    for call in prepared:
        call.result(timeout)
    calls = [node.call_async("train") for node in crew]
    return sorted((call.result(timeout) for call in calls), key=lambda r: r["rank"])

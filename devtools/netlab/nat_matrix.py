"""The pairs-direct matrix over the NAT zoo (ADR 0194): which pairs of NAT kinds end on a direct
(hole-punched) connection and how fast.

``run_matrix(kinds)`` builds a lab with one relay on the backbone and two homes per kind (so a
kind can meet itself), starts a bare agent (``agent.py``: the product's HolePuncher, DCUtR over our
circuit relay, TCP simultaneous open) in every home, and for each unordered pair of kinds lets the
first kind's home dial the second's through the relay and punch (``scenarios.punch``); with
``both_directions`` the second kind's other home also dials the first's other home ("b/a": the first
kind names the dialling side). Pairs run
in parallel where they share no home. Agents in ``upnp`` homes run with ``--port-map`` (ADR 0221): they
map their listen and punch ports on the router and offer the mapped punch port first in DCUtR, so any
peer's SYN reaches them (``upnp`` is not in ``MATRIX_KINDS``, as it needs miniupnpd: ask for it with
``kinds``). With ``quic`` the relay and every home listen on QUIC too (a ``+v6`` home on its IPv6
address as well) and DCUtR punches over QUIC beside TCP (ADR 0228; ``by_pair``'s ``quic`` says
which the direct connection is). After its punch each pair moves ``MOVE_MIB`` MiB from the first
home to the second on the connection the punch left (direct, else relayed), and the relay's own
counters of the pair's circuits say how many bytes crossed it meanwhile (``relayed_bytes``: payload
plus Noise/yamux framing, capped at the bytes moved, so a relayed pair counts 1 and a direct one
about 0). Returns ``{"pairs", "direct", "direct_fraction", "median_time_to_direct_s",
"relayed_bytes_fraction", "by_pair": {"a/b": {"direct", "seconds", "remote", "quic", "moved_bytes",
"relayed_bytes"}}}``, ``relayed_bytes_fraction`` being the relayed bytes over all bytes moved.
"""
from __future__ import annotations

import itertools
import statistics
from concurrent.futures import ThreadPoolExecutor

from .lab import Lab
from .net import PUNCH
from .nodes import Node, peer_id_of
from .scenarios import MIB, punch, wait_received

MATRIX_KINDS = ("full-cone", "restricted", "port-restricted", "symmetric-seq", "symmetric", "cgnat", "udp-blocked")
V6_KINDS = ("symmetric+v6", "symmetric-seq+v6", "port-restricted+v6")   # with IPv6 beside (ADR 0224)
PORT = 4001
MOVE_MIB = 1


def pair_circuit_bytes(relay: Node, a: Node, b: Node) -> dict[str, int]:
    """{session: bytes} of the relay's open circuits between ``a`` and ``b`` (either direction)."""
    circuits = relay.call("status")["open_circuits"]
    return {s: c["bytes"] for s, c in circuits.items() if {c["src"], c["dst"]} == {a.peer_id, b.peer_id}}


def move(sender: Node, receiver: Node, relay: Node, conn: str) -> dict:
    """Send ``MOVE_MIB`` MiB on the sender's connection ``conn``; the bytes moved and the bytes the
    relay carried for the pair meanwhile (see the module docstring)."""
    before = pair_circuit_bytes(relay, sender, receiver)
    sent = sender.call("send", mib=MOVE_MIB, conn=conn, timeout=120)
    if wait_received(receiver, sent["id"])["sha256"] != sent["sha256"]:
        raise AssertionError("data corrupted in transit")
    after = pair_circuit_bytes(relay, sender, receiver)
    carried = sum(n - before.get(s, 0) for s, n in after.items())
    moved = MOVE_MIB * MIB
    return {"moved_bytes": moved, "relayed_bytes": min(moved, max(0, carried))}


def punch_and_move(initiator: Node, responder: Node, relay: Node, quic: bool) -> dict:
    out = punch(initiator, responder, relay, quic=quic)
    return {**out, **move(initiator, responder, relay, out["conn"]["conn"])}


def pair_rounds(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Greedy rounds of pairs in which no home appears twice (each pair runs once)."""
    rounds: list[list[tuple[int, int]]] = []
    for pair in pairs:
        for batch in rounds:
            if not {h for p in batch for h in p} & set(pair):
                batch.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def run_matrix(kinds: tuple[str, ...] = MATRIX_KINDS, punch_args: tuple[str, ...] = PUNCH, *,
               quic: bool = False, both_directions: bool = False) -> dict:
    homes = [kind for kind in kinds for _ in range(2)]          # home 2k+1, 2k+2 are kinds[k]
    lab = Lab().build(["relay"], homes)
    agents: dict[int, Node] = {}
    relay = None
    try:
        names = [f"z{i}" for i in range(1, len(homes) + 1)]
        def quic_listen(ip: str, ip6: str | None = None) -> tuple[str, ...]:
            if not quic:
                return ()
            return ("--quic", f"/ip4/{ip}/udp/{PORT}/quic-v1") + (("--quic", f"/ip6/{ip6}/udp/{PORT}/quic-v1")
                                                                   if ip6 else ())
        relay = Node.start("zrelay", lab.ns_of("relay"), f"/ip4/{lab.public['relay']}/tcp/{PORT}",
                           *quic_listen(lab.public["relay"]), "--relay", "--allow",
                           ",".join(peer_id_of(n) for n in names))

        def start(i: int) -> Node:
            record = lab.homes[i - 1]
            port_map = ("--port-map",) if record.nat == "upnp" else ()
            return Node.start(names[i - 1], record.ns, f"/ip4/{record.ip}/tcp/{PORT}",
                              *quic_listen(record.ip, record.ip6), *punch_args, *port_map)

        with ThreadPoolExecutor(4) as pool:
            for i, node in zip(range(1, len(homes) + 1), pool.map(start, range(1, len(homes) + 1))):
                agents[i] = node
        pairs = [(2 * a + 1, 2 * b + 1 + (a == b)) for a, b in itertools.combinations_with_replacement(
            range(len(kinds)), 2)]
        if both_directions:   # the second kind's other home dials the first's: fresh homes, no prior connection
            pairs += [(2 * b + 2, 2 * a + 2) for a, b in itertools.combinations(range(len(kinds)), 2)]
        by_pair: dict[str, dict] = {}
        for batch in pair_rounds(pairs):
            with ThreadPoolExecutor(len(batch)) as pool:
                outs = list(pool.map(lambda p: punch_and_move(agents[p[0]], agents[p[1]], relay, quic), batch))
            for (x, y), out in zip(batch, outs):
                by_pair[f"{homes[x - 1]}/{homes[y - 1]}"] = {"direct": bool(out["conn"]["direct"]),
                                                              "seconds": round(out["seconds"], 3),
                                                              "remote": out["conn"].get("remote"),
                                                              "quic": bool(out["conn"].get("quic")),
                                                              "moved_bytes": out["moved_bytes"],
                                                              "relayed_bytes": out["relayed_bytes"]}
    finally:
        for node in [*agents.values(), *([relay] if relay else [])]:
            node.stop()
        lab.teardown()
    direct_times = [v["seconds"] for v in by_pair.values() if v["direct"]]
    return {"pairs": len(by_pair), "direct": len(direct_times),
            "direct_fraction": round(len(direct_times) / len(by_pair), 3),
            "median_time_to_direct_s": round(statistics.median(direct_times), 3) if direct_times else None,
            "relayed_bytes_fraction": round(sum(v["relayed_bytes"] for v in by_pair.values())
                                            / sum(v["moved_bytes"] for v in by_pair.values()), 3),
            "by_pair": by_pair}

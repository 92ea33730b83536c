"""The metrics every node exports, whatever its roles: uptime, p2p peers, connections by
direction and path (direct or relayed), stream bytes by protocol, and its ledger transactions.
Read from the node's own state at each scrape (on the event loop, where /metrics is served)."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.runtime import Node


def register_node_metrics(node: Node) -> None:
    metrics = node.metrics
    metrics.gauge("dekube_node_uptime_seconds", "Seconds since the node started.").set_function(lambda: node.uptime)
    metrics.gauge("dekube_p2p_peers", "Peers with an open connection.").set_function(lambda: len(node.peers()))

    def connections() -> dict[tuple[str, ...], float]:
        counts: Counter[tuple[str, ...]] = Counter(
            (c.direction, "relayed" if c.relayed else "direct") for c in node.host.connections())
        for direction in ("inbound", "outbound"):   # always export both rows, so dashboards see zeros
            for path in ("direct", "relayed"):
                counts.setdefault((direction, path), 0)
        return dict(counts)

    metrics.gauge_function("dekube_p2p_connections", "Open p2p connections (shared and bulk) by direction and path.",
                           connections, ["direction", "path"])

    def traffic(direction: str) -> dict[tuple[str, ...], float]:
        return {(proto, path): n for (proto, d, path), n in node.host.traffic.snapshot().items() if d == direction}

    metrics.counter_function("dekube_p2p_bytes_received_total", "Stream payload bytes received, by protocol and path.",
                             lambda: traffic("in"), ["protocol", "path"])
    metrics.counter_function("dekube_p2p_bytes_sent_total", "Stream payload bytes sent, by protocol and path.",
                             lambda: traffic("out"), ["protocol", "path"])
    metrics.counter_function("dekube_ledger_txs_sent_total", "Transactions of this node committed with code 0.",
                             lambda: node.ledger.counters["sent"])
    metrics.counter_function("dekube_ledger_txs_failed_total",
                             "Transactions of this node refused, failed or unconfirmed.",
                             lambda: node.ledger.counters["failed"])

"""Bandwidth that other nodes verified (docs/adr/0219, issue 22 item 4).

A node publishes its own Mbit/s (``hardware.bandwidth_mbps``, its meter's figure, signed by itself).
Its co-workers check it: when a worker commits, it reports each co-worker's upload as its own probes
measured it (node/bandwidth.py, the probe's download leg) in ``commit_result``'s ``peer_rates``
(co-worker -> Mbit/s); the task keeps them (``Task.rate_reports``). When the task settles paid,
each report by a paid worker about a paid co-worker becomes a *measurement* on the co-worker's node
record (``NodeRecord.measured``: the latest per reporter, the `MAX_MEASUREMENTS` latest reporters).

Ranking (`ranking_bandwidth`) counts a claim up to `UNVERIFIED_BANDWIDTH_CAP_MBPS` as before, and
above it only as far as the median of at least `MIN_MEASUREMENTS` measurements by distinct
reporters confirms it: ``min(claim, max(cap, median))``. So a liar gains nothing above the cap
unless most of its last co-workers in paid tasks vouched for it, and an honest node whose co-workers'
probes were limited by their own links loses nothing it had unverified. A reporter cannot vouch
for itself or for a peer outside its task, and only a paid task counts (a crew of sybils must pay
for tasks and be audited ok to move anyone's median).
"""
from __future__ import annotations

import statistics
from typing import Any

from consensus.state.records import NodeRecord, Task
from consensus.state.store import NODE, LedgerState
from consensus.txcodes import TxCode, TxError

UNVERIFIED_BANDWIDTH_CAP_MBPS = 100
MAX_MEASUREMENTS = 5
MIN_MEASUREMENTS = 3


def check_report(task: Task, reporter: str, rates: dict[str, int]) -> None:
    """A committer's ``peer_rates`` name only its co-workers (BAD_PAYLOAD otherwise)."""
    for peer in rates:
        if peer == reporter or peer not in task.workers:
            raise TxError(TxCode.BAD_PAYLOAD, f"peer_rates names {peer[:16]}.., not a co-worker of this task")


def record_paid_task(state: LedgerState, task: Task, paid_workers: list[str], height: int) -> None:
    """Turn the reports of a task that settled paid into measurements: a paid reporter's figure for a
    paid co-worker replaces that reporter's previous one on the co-worker's record."""
    paid = set(paid_workers)
    for reporter in sorted(task.rate_reports):
        if reporter not in paid:
            continue
        for peer, mbps in sorted(task.rate_reports[reporter].items()):
            node = state.nodes.get(peer)
            if peer not in paid or node is None:
                continue
            kept = [entry for entry in node.measured if entry[0] != reporter]
            node.measured = [*kept, [reporter, mbps, height]][-MAX_MEASUREMENTS:]
            state.touch(NODE, peer)


def verified_mbps(node: NodeRecord) -> int | None:
    """The median measurement of ``node`` when at least MIN_MEASUREMENTS reporters measured it."""
    if len(node.measured) < MIN_MEASUREMENTS:
        return None
    return int(statistics.median_low(entry[1] for entry in node.measured))


def ranking_bandwidth(node: NodeRecord) -> int:
    """The Mbit/s placement counts for ``node``: its claim up to the unverified cap, and above it as
    far as its verified figure goes; a missing or malformed claim counts 0."""
    hardware: dict[str, Any] = node.hardware
    declared = hardware.get("bandwidth_mbps", 0)
    if not isinstance(declared, int) or declared < 0:
        return 0
    verified = verified_mbps(node)
    return min(declared, max(UNVERIFIED_BANDWIDTH_CAP_MBPS, verified or 0))

"""Relay bytes per task (docs/adr/0223, issue 25 item 4): what a task's traffic cost the relays.

A worker's all-reduce sends go over bulk connections it opens itself (ml/compute/host_transport.py);
where such a connection is a circuit, the worker's relay client counts every byte the circuit carries
both ways (``relay.transport.StreamPipe``: the count it co-signs the relay's usage receipts against).
At its commit a worker reports, per relay, what the circuits it opened carried while it trained the
task (``commit_result``'s ``relay_bytes``: relay -> bytes); the task keeps each committer's report
(``Task.relay_bytes``). Every circuit is opened by exactly one worker, so the reports add up to the
task's relayed bytes with no byte counted twice. The task keeps the entries naming registered relays
other than the reporter and drops the others without failing the commit: the figure is the worker's
own count, informational (nothing is paid on it: relays are paid on co-signed receipts), and a relay
whose record changed between the worker's look-up and the block must not cost it its commit.
"""
from __future__ import annotations

from collections.abc import Mapping

from consensus.state.store import LedgerState


def kept_entries(state: LedgerState, reporter: str, relayed: Mapping[str, int]) -> dict[str, int]:
    """The entries of a committer's ``relay_bytes`` that name a registered relay other than itself."""
    kept = {}
    for relay, count in relayed.items():
        node = state.nodes.get(relay)
        if relay != reporter and node is not None and "relay" in node.roles:
            kept[relay] = count
    return kept


def by_relay(reports: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """The task's relayed bytes per relay, summed over the committers' reports."""
    totals: dict[str, int] = {}
    for report in reports.values():
        for relay, count in report.items():
            totals[relay] = totals.get(relay, 0) + count
    return dict(sorted(totals.items()))

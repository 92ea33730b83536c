"""Relay bytes per task (docs/adr/0223, issue 25 item 4): what a task's traffic cost the relays.

A worker's all-reduce sends go over bulk connections it opens itself (ml/compute/host_transport.py);
where such a connection is a circuit, the worker's relay client counts every byte the circuit carries
both ways (``relay.transport.StreamPipe``: the count it co-signs the relay's usage receipts against).
At its commit a worker reports, per relay, what the circuits it opened carried while it trained the
task (``commit_result``'s ``relay_bytes``: relay -> bytes); the task keeps each committer's report
(``Task.relay_bytes``). Every circuit is opened by exactly one worker, so the reports add up to the
task's relayed bytes with no byte counted twice. A report names only registered relays; it is the
worker's own count (informational, nothing is paid on it: relays are paid on co-signed receipts).
"""
from __future__ import annotations

from collections.abc import Mapping

from consensus.state.store import LedgerState
from consensus.txcodes import TxCode, TxError


def check_report(state: LedgerState, reporter: str, relayed: Mapping[str, int]) -> None:
    """A committer's ``relay_bytes`` name only registered relays other than itself (BAD_PAYLOAD otherwise)."""
    for relay in relayed:
        node = state.nodes.get(relay)
        if relay == reporter or node is None or "relay" not in node.roles:
            raise TxError(TxCode.BAD_PAYLOAD, f"relay_bytes names {relay[:16]}.., not a registered relay")


def by_relay(reports: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """The task's relayed bytes per relay, summed over the committers' reports."""
    totals: dict[str, int] = {}
    for report in reports.values():
        for relay, count in report.items():
            totals[relay] = totals.get(relay, 0) + count
    return dict(sorted(totals.items()))

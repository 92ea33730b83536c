"""What a worker's task traffic cost the relays: the bytes of the relayed bulk connections it opened,
per relay, over the span of one task (docs/adr/0223, issue 25 item 4).

`HostTransport` hands every bulk connection it opens to `RelayMeter.opened`; for a circuit (a relayed
connection) the meter keeps the circuit's pipe, which counts every byte the circuit carries both ways
(``relay.transport.StreamPipe.bytes_total``, the count this node co-signs the relay's receipts
against). `start` marks a task's beginning (each kept circuit's count at that moment), `take` ends it
and returns relay -> bytes carried since: the whole count of circuits opened after the mark, the
increase of those open at the mark, whether they are still open or have closed since. A circuit
closed before every open mark is forgotten. The all-reduce is the transport's only user and a worker
trains one task at a time (``max_tasks_per_worker`` = 1), so the span's circuit bytes are that task's.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from consensus.tx import MAX_RELAYED_BYTES, MAX_TASK_RELAYS


class CircuitPipe(Protocol):
    """The circuit under a relayed connection, as `relay.transport.StreamPipe` presents it."""

    relay_peer: str

    @property
    def bytes_total(self) -> int: ...

    @property
    def is_closed(self) -> bool: ...


def circuit_pipe(conn: Any) -> CircuitPipe | None:
    """The counting circuit under ``conn`` (a `node.p2p.connection.Connection`), None for a direct one."""
    if not getattr(conn, "relayed", False):
        return None
    pipe = getattr(getattr(conn, "secure", None), "tcp", None)
    return pipe if hasattr(pipe, "relay_peer") and hasattr(pipe, "bytes_total") else None


class RelayMeter:
    """Relayed bytes per relay over a task's span (see the module docstring)."""

    def __init__(self) -> None:
        self._pipes: list[CircuitPipe] = []
        self._marks: dict[str, dict[int, int]] = {}   # task key -> id(pipe) -> its count at the mark

    def opened(self, conn: Any) -> None:
        """A bulk connection was opened: keep its circuit, if it is one."""
        pipe = circuit_pipe(conn)
        if pipe is not None:
            self._forget_closed()
            self._pipes.append(pipe)

    def start(self, key: str) -> None:
        """Task ``key`` begins: what the kept circuits carried so far is not its."""
        self._forget_closed()
        self._marks[key] = {id(pipe): pipe.bytes_total for pipe in self._pipes}

    def take(self, key: str) -> dict[str, int]:
        """Task ``key`` ends: relay -> bytes its circuits carried since `start` (relays with 0 left out)."""
        mark = self._marks.pop(key, {})
        totals: dict[str, int] = {}
        for pipe in self._pipes:
            carried = pipe.bytes_total - mark.get(id(pipe), 0)
            if carried > 0:
                totals[pipe.relay_peer] = totals.get(pipe.relay_peer, 0) + carried
        self._forget_closed()
        return dict(sorted(totals.items()))

    def _forget_closed(self) -> None:
        """Drop the closed circuits no open span needs (all of them when no task is open)."""
        if not self._marks:
            self._pipes = [pipe for pipe in self._pipes if not pipe.is_closed]


def commit_report(relayed: dict[str, int], registered: Collection[str]) -> dict[str, int]:
    """commit_result's ``relay_bytes``: the counts for relays the ledger has registered as relays (it
    refuses others), the `MAX_TASK_RELAYS` largest, each at most `MAX_RELAYED_BYTES`."""
    known = sorted(((count, relay) for relay, count in relayed.items() if relay in registered), reverse=True)
    return {relay: min(count, MAX_RELAYED_BYTES) for count, relay in sorted(known[:MAX_TASK_RELAYS],
                                                                             key=lambda item: item[1])}

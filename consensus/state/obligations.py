"""What a node still owes the ledger: the open tasks and disputes whose outcome can slash it (ADR 0188).

A node is held while it is a worker of a task that is not final (its slash comes at finalize), a
verifier or referee named in such a task's audit slots (a contradicted answer or a losing vote is
slashed at finalize), or the server or a referee of an open serving dispute. Its matured unbonding
entries are not released while it is held (consensus/state/staking.py), so stake cannot leave before
the slash it may owe; bonded stake that moves to unbonding stays slashable all along.
"""
from __future__ import annotations

from consensus.state.records import Task, TaskStatus
from consensus.state.store import LedgerState


def task_parties(task: Task) -> set[str]:
    """Every node a task's settlement can slash: its workers, verifiers and referees."""
    parties = set(task.workers)
    for slot in task.slots:
        parties.update(v["verifier"] for v in slot["verifiers"])
        parties.update(r["referee"] for r in slot["referees"])
    return parties


def held_by(state: LedgerState, peer_id: str) -> str:
    """Why ``peer_id``'s stake is held ("" when it is free): the first open task or serving dispute
    that can still slash it."""
    for task_id, task in state.tasks.items():
        if task.status in TaskStatus.ACTIVE and peer_id in task_parties(task):
            return f"task {task_id.hex()} is {task.status}"
    for ident in sorted(state.open_serve_disputes):
        dispute = state.serve_disputes[ident]
        if peer_id == dispute.server or any(entry[0] == peer_id for entry in dispute.referees):
            return f"serving dispute {ident.hex()} is open"
    return ""

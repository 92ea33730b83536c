"""What a committed block tells subscribers, beyond ``newHeads``: the ``tasks`` topic (task state
machine events) and the ``txs`` topic (each transaction's receipt, keyed by its sender's peer ID).

``task_events`` maps the ledger's block events (consensus/state/tasks.py) to JSON payloads
``{"event", "task_id", "height", ...}`` with events named after the task lifecycle: created,
assigned (with the device and profile), committed (a worker's result), audit_window_opened (status
committed), audit_draw_scheduled {height[, slot, kind]} (draws wait for a later beacon, ADR 0202), then per
audit slot (docs/adr/0168) audit_assigned {slot, worker, segment, verifiers, salt, deadline} (again with
``redraw`` for a silent verifier's replacement), audit_committed {slot, verifier} (a sealed answer),
audit_reveal_open {slot, deadline}, audit_answered (a revealed answer), audit_unrevealed, disputed,
referees_drawn {slot, referees, deadline}, referee_committed {slot, referee} (a sealed vote),
referee_reveal_open {slot, deadline}, referee_voted (a revealed vote), referee_unrevealed (ADR 0210),
availability_challenged {slot, worker, segment,
deadline}, availability_answered {slot, worker, segment, leaf}, availability_withheld {slot, worker}
(ADR 0207), slot_resolved {slot, worker, outcome,
verdict}; finalized (paid, with the result and who was slashed), cancelled, rejection (one worker's reject_task
and reason), rejected (a majority rejected: the reasons and payouts), expired (never assigned: the
reason), expired (nobody committed by the deadline: the reason and payouts), failed (every
committer found guilty: the reason, payouts and who was slashed). ``tx_events`` pairs receipts with their senders.
"""
from __future__ import annotations

import hashlib
from typing import Any

from consensus.state.ledger import BlockResult
from consensus.tx import Tx, decode_tx
from consensus.txcodes import TxError

TASKS_TOPIC = "tasks"
TXS_TOPIC = "txs"

TASK_EVENT_NAMES = {
    "task_submitted": "created",
    "task_assigned": "assigned",
    "result_committed": "committed",
    "audit_window_opened": "audit_window_opened",
    "audit_assigned": "audit_assigned",
    "audit_draw_scheduled": "audit_draw_scheduled",
    "audit_committed": "audit_committed",
    "audit_reveal_open": "audit_reveal_open",
    "audit_answered": "audit_answered",
    "audit_unrevealed": "audit_unrevealed",
    "slot_disputed": "disputed",
    "referees_drawn": "referees_drawn",
    "referee_committed": "referee_committed",
    "referee_reveal_open": "referee_reveal_open",
    "referee_voted": "referee_voted",
    "referee_unrevealed": "referee_unrevealed",
    "availability_challenged": "availability_challenged",
    "availability_answered": "availability_answered",
    "availability_withheld": "availability_withheld",
    "slot_resolved": "slot_resolved",
    "task_paid": "finalized",
    "task_cancelled": "cancelled",
    "task_stop_requested": "stop_requested",
    "task_stopped": "stopped",
    "worker_rejected": "rejection",
    "task_rejected": "rejected",
    "task_expired": "expired",
    "task_failed": "failed",
}


def _json(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def task_events(result: BlockResult) -> list[dict]:
    out = []
    for event in result.events:
        name = TASK_EVENT_NAMES.get(str(event.get("type")))
        if name is None:
            continue
        fields = {k: _json(v) for k, v in event.items() if k != "type"}
        out.append({"event": name, "height": result.height, **fields})
    return out


def tx_events(result: BlockResult, raws: list[bytes], known: dict[bytes, Tx]) -> list[tuple[str, dict]]:
    """(sender, receipt JSON) for each receipt of the block; ``known``: already decoded txs by hash."""
    senders: dict[bytes, str] = {}
    for raw in raws:
        tx_hash = hashlib.sha256(raw).digest()
        tx = known.get(tx_hash)
        if tx is None:
            try:
                tx = decode_tx(raw, max_bytes=len(raw))
            except TxError:
                continue
        senders[tx_hash] = tx.sender
    return [(senders[r.tx_hash], r.to_json()) for r in result.receipts if r.tx_hash in senders]

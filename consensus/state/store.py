"""In-memory ledger state with dirty tracking, and its key/value form for storage.

``LedgerState`` holds one dict per table (accounts, stakes, nodes, tasks, relay channels,
serving escrows and channels, evidence seen, the ended tasks' retention queue and pruned task ids:
ADR 0215) plus chain scalars. Handlers mutate records and call ``touch``; at the end of a block
``take_changes`` returns the encoded ``(key, value | None)`` pairs of every changed record (sorted),
which feed both the app hash and the storage write batch. ``load`` rebuilds the state (and its derived
indexes) from those pairs.
"""
from __future__ import annotations

from typing import Any

from consensus.encoding import decode, encode
from consensus.state.records import (
    Account,
    NodeRecord,
    RelayChannel,
    ServeChannel,
    ServeDispute,
    ServeEscrow,
    Stake,
    Task,
    TaskStatus,
)

ACCOUNT, STAKE, NODE, TASK, CHANNEL, EVIDENCE, META = "acct", "stake", "node", "task", "chan", "evid", "meta"
SERVE_ESCROW, SERVE_CHANNEL, SERVE_DISPUTE = "sesc", "schan", "sdisp"
RETIRE, PRUNED = "retire", "pruned"   # ended tasks' retention queue and pruned tasks (consensus/state/retention.py)
_TABLES = (ACCOUNT, STAKE, NODE, TASK, CHANNEL, SERVE_ESCROW, SERVE_CHANNEL, SERVE_DISPUTE, EVIDENCE, RETIRE, PRUNED)
_PLAIN = (EVIDENCE, RETIRE, PRUNED)   # tables whose values are plain encoded ints, not records
_PREFIX = {name: name.encode() + b"/" for name in (*_TABLES, META)}
_RECORD_TYPES: dict[str, Any] = {ACCOUNT: Account, STAKE: Stake, NODE: NodeRecord, TASK: Task, CHANNEL: RelayChannel,
                 SERVE_ESCROW: ServeEscrow, SERVE_CHANNEL: ServeChannel, SERVE_DISPUTE: ServeDispute}
_META_FIELDS = ("height", "last_block_hash", "last_block_time_ms", "burned", "task_seq", "committee",
                "committee_start", "next_committee", "beacon")
APP_HASH_KEY = _PREFIX[META] + b"app_hash"  # stored beside the state, never part of a change set


def _id_bytes(ident) -> bytes:
    return ident if isinstance(ident, bytes) else ident.encode()


def _id_from_bytes(table: str, raw: bytes):
    return raw if table in (TASK, CHANNEL, SERVE_CHANNEL, SERVE_DISPUTE, *_PLAIN) else raw.decode()


class LedgerState:
    def __init__(self):
        self.accounts: dict[str, Account] = {}
        self.stakes: dict[str, Stake] = {}
        self.nodes: dict[str, NodeRecord] = {}
        self.tasks: dict[bytes, Task] = {}
        self.channels: dict[bytes, RelayChannel] = {}
        self.serve_escrows: dict[str, ServeEscrow] = {}    # client -> its serving escrow (ADR 0174)
        self.serve_channels: dict[bytes, ServeChannel] = {}
        self.serve_disputes: dict[bytes, ServeDispute] = {}  # dispute id -> fraud claim (ADR 0176)
        self.evidence: dict[bytes, int] = {}       # evidence key -> height it was applied at
        self.retire: dict[bytes, int] = {}         # due time + kind + task id -> the task's end time (ms)
        self.pruned_tasks: dict[bytes, int] = {}   # task id -> end time (ms) of a task pruned, for a while
        self.height = 0
        self.app_hash = b""
        self.last_block_hash = b""
        self.last_block_time_ms = 0
        self.beacon = b""                          # the random beacon after the last block (docs/adr/0202)
        self.committee: list[list] = []           # [[peer_id, power], ...] deciding heights >= committee_start
        self.committee_start = 1
        self.next_committee: list[list] = []      # elected a block before the epoch ends, seated at its end
        self.burned = 0
        self.task_seq = 0
        # derived indexes (not stored; rebuilt by load)
        self.open_tasks: dict[bytes, int] = {}     # created, waiting for workers: task_id -> seq
        self.open_serve_disputes: set[bytes] = set()   # serving disputes awaiting their referees
        self.unbonding_queue: dict[int, set[str]] = {}  # release height -> peers
        self.events: list[dict] = []               # this block's events (task assigned, paid, ...)
        self.retention: Any = None                 # retention.py's queues, built on first use
        self._tables = {ACCOUNT: self.accounts, STAKE: self.stakes, NODE: self.nodes, TASK: self.tasks,
                        CHANNEL: self.channels, SERVE_ESCROW: self.serve_escrows,
                        SERVE_CHANNEL: self.serve_channels, SERVE_DISPUTE: self.serve_disputes,
                        EVIDENCE: self.evidence, RETIRE: self.retire, PRUNED: self.pruned_tasks}
        self._dirty: set[tuple[str, object]] = set()
        self._meta_dirty = False

    # ---- tables -------------------------------------------------------------------------

    def table(self, name: str) -> dict:
        return self._tables[name]

    def touch(self, table: str, ident) -> None:
        self._dirty.add((table, ident))

    def touched(self, table: str) -> list:
        """The ids of ``table`` changed since the last ``take_changes``, sorted."""
        return sorted(ident for name, ident in self._dirty if name == table)

    def touch_meta(self) -> None:
        self._meta_dirty = True

    def account(self, peer_id: str) -> Account:
        """The account of ``peer_id``, created empty (not yet dirty) if unknown."""
        acct = self.accounts.get(peer_id)
        if acct is None:
            acct = self.accounts[peer_id] = Account()
        return acct

    def stake(self, peer_id: str) -> Stake:
        stake = self.stakes.get(peer_id)
        if stake is None:
            stake = self.stakes[peer_id] = Stake()
        return stake

    def credit(self, peer_id: str, amount: int) -> None:
        self.account(peer_id).balance += amount
        self._dirty.add((ACCOUNT, peer_id))

    # ---- change sets ----------------------------------------------------------------------

    def take_changes(self) -> list[tuple[bytes, bytes | None]]:
        """Encoded changes since the last call, sorted by key; clears the dirty set."""
        changes: list[tuple[bytes, bytes | None]] = []
        for table, ident in self._dirty:
            key = _PREFIX[table] + _id_bytes(ident)
            record = self.table(table).get(ident)
            if record is None or _is_empty(table, record):
                self.table(table).pop(ident, None)
                changes.append((key, None))
            elif table in _PLAIN:
                changes.append((key, encode(record)))
            else:
                changes.append((key, record.encode()))
        if self._meta_dirty:
            for name in _META_FIELDS:
                changes.append((_PREFIX[META] + name.encode(), encode(getattr(self, name))))
        self._dirty.clear()
        self._meta_dirty = False
        changes.sort(key=lambda kv: kv[0])
        return changes

    def items(self) -> list[tuple[bytes, bytes]]:
        """Every stored key/value of the state, sorted (for full-state hashes and snapshots)."""
        out = []
        for table in _TABLES:
            for ident, record in self.table(table).items():
                if _is_empty(table, record):
                    continue
                value = encode(record) if table in _PLAIN else record.encode()
                out.append((_PREFIX[table] + _id_bytes(ident), value))
        for name in _META_FIELDS:
            out.append((_PREFIX[META] + name.encode(), encode(getattr(self, name))))
        out.sort(key=lambda kv: kv[0])
        return out

    @classmethod
    def load(cls, items) -> LedgerState:
        """Rebuild a state from stored ``(key, value)`` pairs (as ``items()`` produced)."""
        state = cls()
        for key, value in items:
            prefix, _, ident = bytes(key).partition(b"/")
            table = prefix.decode()
            if table == META:
                name = ident.decode()
                if name != "app_hash" and name not in _META_FIELDS:
                    raise ValueError(f"unknown state meta key {name!r}")
                setattr(state, name, decode(value))
            elif table in _PLAIN:
                state.table(table)[ident] = decode(value)
            else:
                state.table(table)[_id_from_bytes(table, ident)] = _RECORD_TYPES[table].decode(value)
        for task_id, task in state.tasks.items():
            if task.status == TaskStatus.CREATED:
                state.open_tasks[task_id] = task.seq
        state.open_serve_disputes = {d for d, rec in state.serve_disputes.items() if rec.status == "open"}
        for peer_id, stake in state.stakes.items():
            for release_height, _ in stake.unbonding:
                state.unbonding_queue.setdefault(release_height, set()).add(peer_id)
        return state


def _is_empty(table: str, record) -> bool:
    if table == ACCOUNT:
        return record.balance == 0 and record.nonce == 0
    if table == STAKE:
        return record.bonded == 0 and not record.unbonding and record.slashed == 0
    if table == SERVE_ESCROW:
        return record.balance == 0 and record.unlock_height == 0
    return False

"""Ledger state records (accounts, stakes, nodes, tasks, relay channels, serving escrows and sessions)
and their encoding.

Each record is a small mutable object with ``to_obj()`` (a canonical-encodable list, field
order fixed by ``FIELDS``) and ``from_obj()``. Storage keys are ``PREFIX + id``.
"""
from __future__ import annotations

from typing import Any

from consensus.encoding import decode, encode


class Record:
    __slots__ = ()
    FIELDS: tuple[str, ...] = ()

    def to_obj(self) -> list:
        return [getattr(self, name) for name in self.FIELDS]

    @classmethod
    def from_obj(cls, obj: list):
        record = cls.__new__(cls)
        for name, value in zip(cls.FIELDS, obj, strict=True):
            setattr(record, name, value)
        return record

    def encode(self) -> bytes:
        return encode(self.to_obj())

    @classmethod
    def decode(cls, raw: bytes):
        return cls.from_obj(decode(raw))

    def to_json(self) -> dict:
        return {name: _jsonable(getattr(self, name)) for name in self.FIELDS}

    def __eq__(self, other):
        return type(self) is type(other) and self.to_obj() == other.to_obj()

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.FIELDS)})"


def _jsonable(value):
    # list(...) snapshots in one C call, so RPC reads stay safe while a worker thread executes a block
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in list(value.items())}
    if isinstance(value, list):
        return [_jsonable(v) for v in list(value)]
    return value


class Account(Record):
    __slots__ = FIELDS = ("balance", "nonce")

    def __init__(self, balance: int = 0, nonce: int = 0):
        self.balance = balance
        self.nonce = nonce


class Stake(Record):
    """Bonded stake, unbonding entries ``[release_height, amount]``, the total slashed, and the
    validator's standing (docs/adr/0165): ``jailed_until`` (0: not jailed; else the height from which
    an ``unjail`` is accepted) and ``missed`` (proposer slots missed in a row). The last two are
    encoded only when set, so a record without them keeps its bytes (and the app hash its value)."""

    __slots__ = FIELDS = ("bonded", "unbonding", "slashed", "jailed_until", "missed")
    _V1_FIELDS = 3

    def __init__(self, bonded: int = 0, unbonding: list | None = None, slashed: int = 0,
                 jailed_until: int = 0, missed: int = 0):
        self.bonded = bonded
        self.unbonding = unbonding if unbonding is not None else []
        self.slashed = slashed
        self.jailed_until = jailed_until
        self.missed = missed

    def to_obj(self) -> list:
        obj = super().to_obj()
        return obj if self.jailed_until or self.missed else obj[:self._V1_FIELDS]

    @classmethod
    def from_obj(cls, obj: list):
        if len(obj) == cls._V1_FIELDS:
            obj = [*obj, 0, 0]
        return super().from_obj(obj)

    @property
    def unbonding_total(self) -> int:
        return sum(amount for _, amount in self.unbonding)


class NodeRecord(Record):
    """A registered node: what it published (roles, addresses, hardware), its reputation, and
    ``measured``: the upload rates co-workers of its paid tasks reported for it, ``[[reporter, Mbit/s,
    height], ...]`` (docs/adr/0219, consensus/state/bandwidth.py), encoded only when there are some."""

    __slots__ = FIELDS = ("roles", "listen_addrs", "relay_addrs", "hardware", "reputation",
                          "registered_height", "active_tasks", "measured")
    _V1_FIELDS = 7

    def __init__(self, roles, listen_addrs, relay_addrs, hardware, reputation=0, registered_height=0,
                 active_tasks=0, measured=None):
        self.roles = roles
        self.listen_addrs = listen_addrs
        self.relay_addrs = relay_addrs
        self.hardware = hardware
        self.reputation = reputation
        self.registered_height = registered_height
        self.active_tasks = active_tasks
        self.measured: list[list[Any]] = measured if measured is not None else []

    def to_obj(self) -> list:
        obj = super().to_obj()
        return obj if self.measured else obj[:self._V1_FIELDS]

    @classmethod
    def from_obj(cls, obj: list):
        if len(obj) == cls._V1_FIELDS:
            obj = [*obj, []]
        return super().from_obj(obj)


class TaskStatus:
    CREATED = "created"
    ASSIGNED = "assigned"
    RUNNING = "running"          # at least one worker committed its result
    COMMITTED = "committed"      # every worker committed, or a quorum did by the commit deadline; audit slots open
    VERIFIED = "verified"        # every audit slot resolved without a mismatch (ADR 0168)
    DISPUTED = "disputed"        # some slot mismatched, is disputed or refereed, or ended guilty or undecided
    PAID = "paid"                # finalized: at least one worker paid, escrow empty
    STOPPED = "stopped"          # finalized at an epoch boundary before its end (crew or owner stopped it,
                                 # ADR 0203, 0211): the closed epochs' workers paid, the rest refunded
    CANCELLED = "cancelled"      # refunded before assignment
    REJECTED = "rejected"        # a strict majority of its workers reported it untrainable: refunded less reject_fee
    EXPIRED = "expired"          # not assigned within task_assign_s, or nobody committed by the deadline: refunded
    FAILED = "failed"            # finalized without paying a worker: every committer was found guilty (ADR 0187)

    OPEN_FOR_COMMITS = frozenset({ASSIGNED, RUNNING})
    AUDITABLE = frozenset({COMMITTED, VERIFIED, DISPUTED})
    ACTIVE = frozenset({ASSIGNED, RUNNING, COMMITTED, VERIFIED, DISPUTED})
    FINAL = frozenset({PAID, STOPPED, CANCELLED, REJECTED, EXPIRED, FAILED})   # escrow empty, nothing more can happen


class SlotOutcome:
    """Where an audit slot stands (docs/adr/0168, consensus/state/audits.py)."""
    PENDING = "pending"          # still being decided
    OK = "ok"                    # the worker's segment replayed to its committed hash
    GUILTY = "guilty"            # it did not, and the verdict says so
    UNAUDITED = "unaudited"      # no verifier answered (or none could be drawn)
    UNDECIDED = "undecided"      # the referees reached no verdict

    PAID = frozenset({OK, GUILTY})   # a verdict the verifiers and referees who agreed with it are paid for


class Task(Record):
    """A training task: spec, escrow, lifecycle status, workers, commitments, audits, payouts.

    Deadlines are block times in milliseconds (docs/adr/0187, consensus/state/deadlines.py), as are
    the audit slots' ``deadline``, ``dispute_deadline`` and ``referee_deadline``.
    ``commit_deadline``: last block time that accepts a commitment (assignment + a span derived from
    the spec's ``expected_s``, brought forward to the quorum's commit + the grace once a quorum
    committed, see deadlines.commit_grace_ms); ``window_end``: from when finalize may pay a task that
    is committed but not verified; ``assign_deadline``: the block time after which a task still
    waiting for workers expires;
    ``commits``: worker -> [segments_root, result_hash, segments, height];
    ``audits``: legacy (before ADR 0168), always empty;
    ``relay_claims``: relay -> amount owed from the relay budget; ``payouts``: peer -> amount;
    ``sources``: the owner's multiaddrs to fetch the task's artifacts from; ``device``: what the
    workers train on (as asked; "any" becomes "cuda" or "cpu" at assignment); ``rejections``:
    worker -> reason (reject_task); ``reason``: why the task was rejected, expired or failed; ``result``:
    the result_hash (weights artifact id) the most paid committers agreed on, set at finalize.
    ``profile``: the execution profile its workers and verifiers run ("" = legacy, anyone);
    ``segments``: the spec's declared segment count (0: not declared); ``slots``: the audit slots
    drawn when the commit phase closed (consensus/state/audits.py, docs/adr/0168). ``audits`` and
    ``disputes`` belong to the free-for-all audits before ADR 0168 and stay empty.
    ``epochs``: the progress of a task cut into epochs (the spec's ``epochs`` > 1, docs/adr/0203,
    consensus/state/epochs.py): ``{"current": the open epoch, "commits": worker -> [[segments_root,
    state_digest, segments, height], ...] one per epoch, and, once the crew stopped committing,
    "stopped": the epoch it stopped in; "stop_at": the epoch its owner stops it after (ADR 0211);
    "joined": worker -> [seat, first epoch] for each worker named to a seat its occupant left (ADR 0226,
    consensus/state/crew.py; joiners follow the original workers in ``workers``)}``;
    {} for a task without epochs.
    ``rate_reports``: reporter -> {co-worker: Mbit/s}, the upload rates each committer's all-reduce
    agreed for its co-workers (commit_result's ``peer_rates``, docs/adr/0219); {} when none reported.
    ``relay_bytes``: reporter -> {relay: bytes}, what the circuits this committer opened for the task's
    all-reduce carried through each relay (commit_result's ``relay_bytes``, docs/adr/0223); {} when none.
    """

    __slots__ = FIELDS = ("owner", "seq", "spec", "price", "escrow", "status", "created_height",
                          "assigned_height", "commit_deadline", "workers", "commits", "audits", "disputes",
                          "window_end", "relay_claims", "audit_seed", "payouts",
                          "sources", "device", "rejections", "reason", "result",
                          "profile", "segments", "slots", "assign_deadline", "epochs", "rate_reports",
                          "relay_bytes")
    V1_FIELDS = 17   # records stored before sources..result existed have only the first 17 fields
    V2_FIELDS = 22   # ... and before profile..slots (ADR 0168) the first 22: encoded so while those are unset
    V3_FIELDS = 25   # ... and before assign_deadline (ADR 0187) the first 25: encoded so while it is 0
    V4_FIELDS = 26   # ... and before epochs (ADR 0203) the first 26: encoded so while it is empty
    V5_FIELDS = 27   # ... and before rate_reports (ADR 0219) the first 27: encoded so while it is empty
    V6_FIELDS = 28   # ... and before relay_bytes (ADR 0223) the first 28: encoded so while it is empty

    def __init__(self, owner: str, seq: int, spec: dict, price: int, created_height: int,
                 sources: list | None = None, device: str = "cpu"):
        self.owner = owner
        self.seq = seq
        self.spec = spec
        self.price = price
        self.escrow = price
        self.status = TaskStatus.CREATED
        self.created_height = created_height
        self.assigned_height = 0
        self.commit_deadline = 0
        self.workers: list[str] = []
        self.commits: dict[str, Any] = {}
        self.audits: list[Any] = []
        self.disputes: list[Any] = []
        self.window_end = 0
        self.relay_claims: dict[str, Any] = {}
        self.audit_seed = b""
        self.payouts: dict[str, int] = {}
        self.sources = sources if sources is not None else []
        self.device = device
        self.rejections: dict[str, Any] = {}
        self.reason = ""
        self.result = b""
        self.profile = ""
        self.segments = 0
        self.slots: list[Any] = []
        self.assign_deadline = 0
        self.epochs: dict[str, Any] = {}
        self.rate_reports: dict[str, dict[str, int]] = {}
        self.relay_bytes: dict[str, dict[str, int]] = {}

    def to_obj(self) -> list:
        obj = super().to_obj()
        if self.relay_bytes:
            return obj
        obj = obj[:self.V6_FIELDS]
        if self.rate_reports:
            return obj
        obj = obj[:self.V5_FIELDS]
        if self.epochs:
            return obj
        if self.assign_deadline:
            return obj[:self.V4_FIELDS]
        return obj[:self.V3_FIELDS] if self.profile or self.segments or self.slots else obj[:self.V2_FIELDS]

    @classmethod
    def from_obj(cls, obj: list):
        if len(obj) == cls.V1_FIELDS:   # a record from before ADR 0151: the new fields at their defaults
            obj = [*obj, [], "cpu", {}, "", b""]
        if len(obj) == cls.V2_FIELDS:   # a record from before ADR 0168
            obj = [*obj, "", 0, []]
        if len(obj) == cls.V3_FIELDS:   # a record from before ADR 0187
            obj = [*obj, 0]
        if len(obj) == cls.V4_FIELDS:   # a record from before ADR 0203
            obj = [*obj, {}]
        if len(obj) == cls.V5_FIELDS:   # a record from before ADR 0219
            obj = [*obj, {}]
        if len(obj) == cls.V6_FIELDS:   # a record from before ADR 0223
            obj = [*obj, {}]
        return super().from_obj(obj)


class RelayChannel(Record):
    """Cumulative bytes and amount already paid for one (relay, src, dst, session)."""

    __slots__ = FIELDS = ("bytes_paid", "amount_paid")

    def __init__(self, bytes_paid: int = 0, amount_paid: int = 0):
        self.bytes_paid = bytes_paid
        self.amount_paid = amount_paid


class ServeEscrow(Record):
    """A client's serving escrow (ADR 0174): ``balance`` servers are paid from by receipts;
    ``unlock_height``: 0 while locked, else the height from which the client may withdraw."""

    __slots__ = FIELDS = ("balance", "unlock_height")

    def __init__(self, balance: int = 0, unlock_height: int = 0):
        self.balance = balance
        self.unlock_height = unlock_height


class ServeChannel(Record):
    """What one serving session (session id, server, client) was already paid: the last receipt's
    sequence number and cumulative tokens, FLOPs and amount, and the height it was claimed at (the
    session's disputes close ``serve_dispute_window`` blocks later, ADR 0178)."""

    __slots__ = FIELDS = ("seq", "tokens", "flops", "amount_paid", "claimed_height")

    def __init__(self, seq: int = 0, tokens: int = 0, flops: int = 0, amount_paid: int = 0, claimed_height: int = 0):
        self.seq = seq
        self.tokens = tokens
        self.flops = flops
        self.amount_paid = amount_paid
        self.claimed_height = claimed_height


class ServeDispute(Record):
    """A client's fraud claim against a server's signed answer (ADR 0176): the parties, what the
    transcript commits to (``prior``: the transcript before the step, ``link``: the step, ``answer``:
    the server's answer digest, ``inputs``: the content hash of the bundle referees recompute from),
    the client's ``bond``, the drawn referees (``[peer_id, vote | None]``, a vote ``[valid, output]``;
    empty until drawn from a later beacon, ADR 0210), the vote ``deadline`` (a block time in ms, ADR 0241; the
    draw's height while ``referees`` is empty), ``status`` (open, guilty, rejected, undecided) and the
    client's ``addrs``."""

    __slots__ = FIELDS = ("client", "server", "session", "model", "profile", "start", "end", "prior", "link",
                          "answer", "inputs", "bond", "referees", "deadline", "status", "addrs")

    def __init__(self, client: str = "", server: str = "", session: bytes = b"", model: str = "", profile: str = "",
                 start: int = 0, end: int = 0, prior: bytes = b"", link: bytes = b"", answer: bytes = b"",
                 inputs: bytes = b"", bond: int = 0, referees: list | None = None, deadline: int = 0,
                 status: str = "open", addrs: list | None = None):
        self.client, self.server, self.session, self.model, self.profile = client, server, session, model, profile
        self.start, self.end, self.prior, self.link = start, end, prior, link
        self.answer, self.inputs = answer, inputs
        self.bond = bond
        self.referees = referees if referees is not None else []
        self.deadline = deadline
        self.status = status
        self.addrs = addrs if addrs is not None else []

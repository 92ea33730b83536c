"""Typed records of a task as the ledger shows it (``dkb_getTask``, ``dkb_listTasks``), for the readers
above consensus (ml/compute, cli/): `TaskStatus`, `SlotOutcome`, the frozen records `TaskInfo`,
`AuditSlot` (with its `VerifierSeat`, `RefereeSeat`, `Answer` and `PendingDraw`), `Commit` and
`EpochProgress` (with its `EpochCommit`), and the one decoder
from the JSON form, `TaskInfo.from_json`. The ledger writes that form (``consensus.state.ledger
.task_json``: the `Task` record's fields, bytes as hex, plus ``task_id``, the current ``result`` and
``block_time_ms``); nothing above consensus reads a task or slot by string key.

The decoder takes what a validator answered, so it checks every field's type and raises
`TaskDocError` (a ValueError) with the field's name; a field the document leaves out gets the value
the ledger gives a record that predates it (records from before ADR 0151, 0168, 0187, 0202, 0203 and 0207 lack
some).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consensus.state import crew
from consensus.state.records import SlotOutcome, TaskStatus
from consensus.state.relay_bytes import by_relay

__all__ = ["Answer", "AuditSlot", "Challenge", "Commit", "EpochCommit", "EpochProgress", "PendingDraw", "RefereeSeat",
           "SlotOutcome", "TaskDocError", "TaskStatus", "TaskInfo", "VerifierSeat", "decode_tasks"]


class TaskDocError(ValueError):
    """A task document that does not have the ledger's shape."""


def _get(doc: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any, where: str) -> Any:
    value = doc.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TaskDocError(f"{where}.{name}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise TaskDocError(f"{where}.{name}: expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))


def _int(doc: Mapping[str, Any], name: str, where: str) -> int:
    value: int = _get(doc, name, int, 0, where)
    return value


def _str(doc: Mapping[str, Any], name: str, where: str, default: str = "") -> str:
    value: str = _get(doc, name, str, default, where)
    return value


def _mapping(doc: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    value: dict[str, Any] = _get(doc, name, dict, {}, where)
    return value


def _list(doc: Mapping[str, Any], name: str, where: str) -> list[Any]:
    value: list[Any] = _get(doc, name, list, [], where)
    return value


def _bool(doc: Mapping[str, Any], name: str, where: str) -> bool:
    value: bool = _get(doc, name, bool, False, where)
    return value


def _entries(doc: Mapping[str, Any], name: str, where: str) -> list[Mapping[str, Any]]:
    items = _list(doc, name, where)
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TaskDocError(f"{where}.{name}[{index}]: expected an object, got {type(item).__name__}")
    return items


def _str_map(doc: Mapping[str, Any], name: str, kind: type, where: str) -> dict[str, Any]:
    out = _mapping(doc, name, where)
    for key, value in out.items():
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TaskDocError(f"{where}.{name}[{key!r}]: expected {kind.__name__}")
    return dict(out)


@dataclass(frozen=True)
class Answer:
    """A verifier's answer or a referee's vote (or a slot's verdict): does the segment replay to the
    committed hash, and the evidence (hex) behind it; ``step``: a mismatching answer's first bad step."""

    match: bool
    evidence: str
    step: int = 0
    withheld: bool = False   # a verdict: the worker let an availability challenge expire (docs/adr/0207)

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Answer | None:
        if doc is None:
            return None
        if not isinstance(doc, Mapping):
            raise TaskDocError(f"{where}: expected an object, got {type(doc).__name__}")
        return cls(bool(_get(doc, "match", bool, False, where)), _str(doc, "evidence", where), _int(doc, "step", where),
                   _bool(doc, "withheld", where))

    @property
    def key(self) -> tuple[bool, str]:
        """What answers are compared by (the step only explains a mismatch)."""
        return self.match, self.evidence


@dataclass(frozen=True)
class VerifierSeat:
    """One drawn verifier of a slot, its answer deadline (block time, ms) and its answer (docs/adr/0202:
    ``commitment``, hex, the sealed answer it sent first; ``answer`` once revealed; ``unrevealed``: the
    reveal window closed without it; ``replaced``: a redraw was scheduled for it, silent or unrevealed)."""

    verifier: str
    deadline: int
    answer: Answer | None
    redraw: bool = False
    commitment: str | None = None
    unrevealed: bool = False
    replaced: bool = False
    set_aside: tuple[Answer, ...] = ()   # its earlier answers, set aside when it was asked again (docs/adr/0207)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> VerifierSeat:
        commitment = doc.get("commitment")
        if commitment is not None and not isinstance(commitment, str):
            raise TaskDocError(f"{where}.commitment: expected str, got {type(commitment).__name__}")
        set_aside = []
        for i, earlier in enumerate(_list(doc, "set_aside", where)):
            answer = Answer.from_json(earlier, f"{where}.set_aside[{i}]")
            if answer is None:
                raise TaskDocError(f"{where}.set_aside[{i}]: expected an object, got null")
            set_aside.append(answer)
        return cls(_str(doc, "verifier", where), _int(doc, "deadline", where),
                   Answer.from_json(doc.get("answer"), f"{where}.answer"), _bool(doc, "redraw", where),
                   commitment, _bool(doc, "unrevealed", where), _bool(doc, "replaced", where), tuple(set_aside))

    @property
    def rounds(self) -> int:
        """How many times the ledger asked it again (docs/adr/0207)."""
        return len(self.set_aside)

    @property
    def sealed(self) -> bool:
        """Whether it committed to an answer it may still reveal (consensus/state/audits.py ``sealed``)."""
        return self.commitment is not None and not self.unrevealed


@dataclass(frozen=True)
class PendingDraw:
    """A draw the ledger runs for a slot at the end of block ``at`` from that block's beacon (docs/adr/0202):
    ``kind`` open (the slot's segment, salt and verifiers), redraw or referee, ``count`` parties."""

    kind: str
    at: int
    count: int = 0

    @classmethod
    def from_json(cls, doc: Any, where: str) -> PendingDraw | None:
        if doc is None:
            return None
        if not isinstance(doc, Mapping):
            raise TaskDocError(f"{where}: expected an object, got {type(doc).__name__}")
        return cls(_str(doc, "kind", where), _int(doc, "at", where), _int(doc, "count", where))


@dataclass(frozen=True)
class Challenge:
    """A slot's availability challenge (docs/adr/0207): ``deadline`` (block time, ms) while the worker
    must answer it (0 when none is open) and how many the worker has answered."""

    deadline: int = 0
    responses: int = 0

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Challenge | None:
        if doc is None:
            return None
        if not isinstance(doc, Mapping):
            raise TaskDocError(f"{where}: expected an object, got {type(doc).__name__}")
        return cls(_int(doc, "deadline", where), _int(doc, "responses", where))

    @property
    def open(self) -> bool:
        return self.deadline > 0


@dataclass(frozen=True)
class RefereeSeat:
    """One drawn referee of a contested slot, the panel it sits on and its vote (docs/adr/0210:
    ``commitment``, hex, the sealed vote it sent first; ``vote`` once revealed; ``unrevealed``: the
    slot's vote reveal window closed without it)."""

    referee: str
    vote: Answer | None
    panel: int = 0
    deadline: int = 0   # its own deadline when the ledger gives one; else the slot's referee_deadline
    commitment: str | None = None
    unrevealed: bool = False

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> RefereeSeat:
        commitment = doc.get("commitment")
        if commitment is not None and not isinstance(commitment, str):
            raise TaskDocError(f"{where}.commitment: expected str, got {type(commitment).__name__}")
        return cls(_str(doc, "referee", where), Answer.from_json(doc.get("vote"), f"{where}.vote"),
                   _int(doc, "panel", where), _int(doc, "deadline", where), commitment,
                   _bool(doc, "unrevealed", where))

    @property
    def sealed(self) -> bool:
        """Whether it committed to a vote it may still reveal."""
        return self.commitment is not None and not self.unrevealed


@dataclass(frozen=True)
class SlotCommit:
    """The commitment an audit slot checks (docs/adr/0230): the worker's ``segments_root`` (hex) over its
    segments ``first`` .. ``segments`` - 1, the slot's segment drawn from ``low`` on (its epoch's)."""

    segments_root: str
    segments: int
    first: int = 0
    low: int = 0

    @classmethod
    def from_json(cls, doc: Any, where: str) -> SlotCommit | None:
        if doc is None:
            return None
        if not isinstance(doc, Mapping):
            raise TaskDocError(f"{where}: expected an object, got {type(doc).__name__}")
        commit = cls(_str(doc, "root", where), _int(doc, "segments", where), _int(doc, "first", where),
                     _int(doc, "low", where))
        if not 0 <= commit.first <= commit.low < commit.segments:
            raise TaskDocError(f"{where}: expected first <= low < segments")
        return commit


@dataclass(frozen=True)
class AuditSlot:
    """One audit slot of a task (docs/adr/0168): the audited worker's segment, the salt, the drawn
    verifiers and referees, the dispute window and the outcome (`SlotOutcome`)."""

    slot: int
    worker: str
    segment: int
    salt: bytes
    verifiers: tuple[VerifierSeat, ...] = ()
    dispute_deadline: int = 0
    disputed: bool = False
    dispute_height: int = 0   # the height the worker disputed at
    referees: tuple[RefereeSeat, ...] = ()
    referee_deadline: int = 0
    verdict: Answer | None = None
    outcome: str = SlotOutcome.PENDING
    reveal_deadline: int = 0   # while the reveals of the committed answers are open (docs/adr/0202)
    referee_reveal_deadline: int = 0   # while the reveals of the committed referee votes are open (0210)
    draw: PendingDraw | None = None   # a draw scheduled for a later block's beacon (docs/adr/0202)
    challenge: Challenge | None = None   # an availability challenge, open or answered (docs/adr/0207)
    epoch: int = 0                       # the epoch whose work it audits (docs/adr/0230)
    commit: SlotCommit | None = None     # the commitment it checks (None from a ledger before ADR 0230)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> AuditSlot:
        try:
            salt = bytes.fromhex(_str(doc, "salt", where))
        except ValueError as exc:
            raise TaskDocError(f"{where}.salt: not hex") from exc
        seat = f"{where}.verifiers"
        verifiers = tuple(VerifierSeat.from_json(v, seat) for v in _entries(doc, "verifiers", where))
        referees = tuple(RefereeSeat.from_json(r, f"{where}.referees") for r in _entries(doc, "referees", where))
        dispute = doc.get("dispute")
        if dispute is not None and not isinstance(dispute, Mapping):
            raise TaskDocError(f"{where}.dispute: expected an object, got {type(dispute).__name__}")
        return cls(slot=_int(doc, "slot", where), worker=_str(doc, "worker", where),
                   segment=_int(doc, "segment", where), salt=salt, verifiers=verifiers,
                   dispute_deadline=_int(doc, "dispute_deadline", where),
                   disputed=bool(dispute),
                   dispute_height=_int(dispute, "height", f"{where}.dispute") if dispute else 0,
                   referees=referees, referee_deadline=_int(doc, "referee_deadline", where),
                   verdict=Answer.from_json(doc.get("verdict"), f"{where}.verdict"),
                   outcome=_str(doc, "outcome", where, SlotOutcome.PENDING),
                   reveal_deadline=_int(doc, "reveal_deadline", where),
                   referee_reveal_deadline=_int(doc, "referee_reveal_deadline", where),
                   draw=PendingDraw.from_json(doc.get("draw"), f"{where}.draw"),
                   challenge=Challenge.from_json(doc.get("challenge"), f"{where}.challenge"),
                   epoch=_int(doc, "epoch", where), commit=SlotCommit.from_json(doc.get("commit"), f"{where}.commit"))

    @property
    def pending(self) -> bool:
        return self.outcome == SlotOutcome.PENDING

    @property
    def parties(self) -> tuple[str, ...]:
        """Its verifiers and referees."""
        return tuple(v.verifier for v in self.verifiers) + tuple(r.referee for r in self.referees)

    @property
    def challenge_deadline(self) -> int:
        """The deadline of its open availability challenge (0 when none is open)."""
        return self.challenge.deadline if self.challenge else 0

    def deadlines(self) -> list[int]:
        """The block times at which a pending slot moves on: one past each deadline (answers, dispute,
        referee votes, reveals, an availability challenge) it has."""
        out = [v.deadline for v in self.verifiers]
        out += [deadline + 1 for deadline in (self.dispute_deadline, self.referee_deadline, self.reveal_deadline,
                                              self.referee_reveal_deadline, self.challenge_deadline) if deadline]
        return [d + 1 for d in out]


@dataclass(frozen=True)
class Commit:
    """A worker's commitment: the root of its segment records, its result (weights artifact id), the
    number of segments, the height it was committed at."""

    segments_root: str
    result: str
    segments: int
    height: int

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Commit:
        if (not isinstance(doc, list) or len(doc) < 4 or not all(isinstance(x, str) for x in doc[:2])
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in doc[2:4])):
            raise TaskDocError(f"{where}: expected [segments_root, result, segments, height]")
        return cls(doc[0], doc[1], doc[2], doc[3])


@dataclass(frozen=True)
class EpochCommit:
    """A worker's progress commitment at the end of one epoch (docs/adr/0203): the root of its segment
    records so far, the digest of its state at the epoch end (both hex), their count, the height."""

    segments_root: str
    state_digest: str
    segments: int
    height: int

    @classmethod
    def from_json(cls, doc: Any, where: str) -> EpochCommit:
        if (not isinstance(doc, list) or len(doc) < 4 or not all(isinstance(x, str) for x in doc[:2])
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in doc[2:4])):
            raise TaskDocError(f"{where}: expected [segments_root, state_digest, segments, height]")
        return cls(doc[0], doc[1], doc[2], doc[3])


@dataclass(frozen=True)
class EpochProgress:
    """The progress of a task cut into epochs (docs/adr/0203, consensus/state/epochs.py): the open epoch
    (``current``, from 0), each worker's progress commitments in epoch order, ``stopped``: the epoch
    the crew stopped committing in (None while it has not), and ``stop_at``: the epoch its owner stops
    the task after (``stop_task``, docs/adr/0211; None when not asked)."""

    current: int = 0
    commits: Mapping[str, tuple[EpochCommit, ...]] = field(default_factory=dict)
    stopped: int | None = None
    stop_at: int | None = None
    joined: Mapping[str, tuple[int, int]] = field(default_factory=dict)   # joiner -> (seat, first epoch)
    released: tuple[int, ...] = ()                      # epochs paid out as audited (docs/adr/0230)
    earned: Mapping[str, int] = field(default_factory=dict)   # worker -> its pay for those so far
    restarts: int = 0   # times the crew died and the open epoch restarted on a new one (docs/adr/0232)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> EpochProgress:
        commits = {}
        for worker, entries in _mapping(doc, "commits", where).items():
            if not isinstance(entries, list):
                raise TaskDocError(f"{where}.commits[{worker!r}]: expected a list, got {type(entries).__name__}")
            commits[worker] = tuple(EpochCommit.from_json(entry, f"{where}.commits[{worker!r}][{i}]")
                                    for i, entry in enumerate(entries))
        stopped: int | None = _get(doc, "stopped", int, None, where)
        stop_at: int | None = _get(doc, "stop_at", int, None, where)
        joined = {}
        for worker, entry in _get(doc, "joined", dict, {}, where).items():
            if (not isinstance(entry, list) or len(entry) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in entry)):
                raise TaskDocError(f"{where}.joined[{worker!r}]: expected [seat, first epoch]")
            joined[worker] = (entry[0], entry[1])
        released = _get(doc, "released", list, [], where)
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in released):
            raise TaskDocError(f"{where}.released: expected a list of epochs")
        restarts: int = _get(doc, "restarts", int, 0, where)
        return cls(_int(doc, "current", where), commits, stopped, stop_at, joined, tuple(released),
                   _str_map(doc, "earned", int, where), restarts)

    def of(self, worker: str) -> tuple[EpochCommit, ...]:
        """``worker``'s progress commitments, in epoch order (from its first epoch)."""
        return self.commits.get(worker, ())

    def first_epoch(self, worker: str) -> int:
        """The first epoch ``worker`` trains (0, or the epoch a joiner enters at)."""
        return crew.first_epoch_of(self.joined, worker)

    def commit_of(self, worker: str, epoch: int) -> EpochCommit | None:
        """``worker``'s progress commitment for ``epoch`` (None when it made none)."""
        mine, first = self.of(worker), self.first_epoch(worker)
        return mine[epoch - first] if first <= epoch < first + len(mine) else None


@dataclass(frozen=True)
class TaskInfo:
    """A training task as the ledger shows it (see consensus/state/records.py ``Task`` for each field)."""

    task_id: str
    status: str
    owner: str = ""
    seq: int = 0
    spec: Mapping[str, Any] = field(default_factory=dict)
    price: int = 0
    escrow: int = 0
    created_height: int = 0
    assigned_height: int = 0
    commit_deadline: int = 0
    workers: tuple[str, ...] = ()
    commits: Mapping[str, Commit] = field(default_factory=dict)
    window_end: int = 0
    relay_claims: Mapping[str, int] = field(default_factory=dict)
    payouts: Mapping[str, int] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    device: str = "cpu"
    rejections: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""
    result: str = ""
    profile: str = ""
    segments: int = 0
    slots: tuple[AuditSlot, ...] = ()
    assign_deadline: int = 0
    epochs: EpochProgress | None = None   # a task cut into epochs (docs/adr/0203); None for one without
    relay_bytes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)   # worker -> relay -> bytes (ADR 0223)
    block_time_ms: int = 0
    doc: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)   # the JSON it came from

    @classmethod
    def from_json(cls, doc: Any) -> TaskInfo:
        """The one decoder: a ``dkb_getTask`` document (or a ``dkb_listTasks`` entry) as a TaskInfo."""
        if not isinstance(doc, Mapping):
            raise TaskDocError(f"task: expected an object, got {type(doc).__name__}")
        where = "task"
        workers = _list(doc, "workers", where)
        sources = _list(doc, "sources", where)
        for name, items in (("workers", workers), ("sources", sources)):
            if not all(isinstance(x, str) for x in items):
                raise TaskDocError(f"task.{name}: expected a list of strings")
        commits = {worker: Commit.from_json(value, f"task.commits[{worker!r}]")
                   for worker, value in _mapping(doc, "commits", where).items()}
        slots = tuple(AuditSlot.from_json(slot, f"task.slots[{i}]")
                      for i, slot in enumerate(_entries(doc, "slots", where)))
        progress = _mapping(doc, "epochs", where)
        return cls(task_id=_str(doc, "task_id", where), status=_str(doc, "status", where),
                   owner=_str(doc, "owner", where), seq=_int(doc, "seq", where),
                   spec=dict(_mapping(doc, "spec", where)), price=_int(doc, "price", where),
                   escrow=_int(doc, "escrow", where), created_height=_int(doc, "created_height", where),
                   assigned_height=_int(doc, "assigned_height", where),
                   commit_deadline=_int(doc, "commit_deadline", where), workers=tuple(workers), commits=commits,
                   window_end=_int(doc, "window_end", where), relay_claims=_str_map(doc, "relay_claims", int, where),
                   payouts=_str_map(doc, "payouts", int, where), sources=tuple(sources),
                   device=_str(doc, "device", where, "cpu"), rejections=_str_map(doc, "rejections", str, where),
                   reason=_str(doc, "reason", where), result=_str(doc, "result", where),
                   profile=_str(doc, "profile", where), segments=_int(doc, "segments", where), slots=slots,
                   assign_deadline=_int(doc, "assign_deadline", where),
                   epochs=EpochProgress.from_json(progress, "task.epochs") if progress else None,
                   block_time_ms=_int(doc, "block_time_ms", where),
                   relay_bytes={worker: _str_map(_mapping(doc, "relay_bytes", where), worker, int, "task.relay_bytes")
                                for worker in _mapping(doc, "relay_bytes", where)},
                   doc=doc)

    @property
    def task_bytes(self) -> bytes:
        """The task id as bytes (what transactions carry)."""
        return bytes.fromhex(self.task_id)

    @property
    def relayed_by_relay(self) -> dict[str, int]:
        """The bytes the task's circuits carried through each relay, summed over the workers' reports."""
        return by_relay(self.relay_bytes)

    @property
    def parties(self) -> tuple[str, ...]:
        """The verifiers and referees drawn for its slots."""
        return tuple(p for slot in self.slots for p in slot.parties)

    def spec_field(self, name: str, default: Any = None) -> Any:
        """One field of the task's spec (the spec is the owner's; its fields are read by ml.compute.task_spec)."""
        return self.spec.get(name, default)

    @property
    def seats(self) -> int:
        """How many seats (training ranks) the task has: the workers it asked for (docs/adr/0226)."""
        return int(self.spec.get("workers", len(self.workers)))

    @property
    def max_seats(self) -> int:
        """How many seats the crew may grow to (``max_workers``; the seats asked for when not given)."""
        most = self.spec.get("max_workers")
        return most if isinstance(most, int) and most > self.seats else self.seats

    def world_at(self, epoch: int) -> int:
        """The training world of ``epoch``: the seats open by then (an extra seat opens when its first
        worker enters; docs/adr/0234)."""
        return crew.world_at(self.seats, self._joined, epoch)

    def shards_from(self, epoch: int) -> int:
        """The first segment of the epoch since which ``epoch``'s world holds: where its data shards start
        (0 while the crew never grew)."""
        since = crew.world_since(self.seats, self._joined, epoch)
        return since * self._per_epoch()

    def epoch_of(self, segment: int) -> int:
        """The epoch ``segment`` belongs to (0 for a task without epochs)."""
        return segment // self._per_epoch() if self._per_epoch() else 0

    @property
    def _joined(self) -> Mapping[str, tuple[int, int]]:
        """Each joiner's [seat, first epoch] (none for a task without epochs)."""
        return self.epochs.joined if self.epochs is not None else {}

    def _per_epoch(self) -> int:
        epochs = self.spec.get("epochs", 1)
        return self.segments // epochs if isinstance(epochs, int) and epochs > 0 else self.segments

    def seat_of(self, worker: str) -> int:
        """``worker``'s seat, its rank in training: a joiner's is the seat it took, an original worker's its
        place among the first ``seats`` workers (consensus/state/crew.py)."""
        return crew.seat_of(self.workers[:self.seats], self._joined, worker)

    def first_epoch(self, worker: str) -> int:
        """The first epoch ``worker`` trains (0, or a joiner's)."""
        return self.epochs.first_epoch(worker) if self.epochs is not None else 0

    @property
    def committers(self) -> list[str]:
        """Every worker that committed anything: a result, or an epoch's progress (sorted)."""
        progress = {w for w, entries in self.epochs.commits.items() if entries} if self.epochs is not None else set()
        return sorted(set(self.commits) | progress)

    def covering(self, worker: str, segment: int) -> SlotCommit | None:
        """``worker``'s earliest commitment that covers ``segment``: a progress commitment, else its result
        (None when it committed none that does)."""
        first = self.first_segment(worker)
        if segment < first:
            return None
        entries = self.epochs.of(worker) if self.epochs is not None else ()
        for commit in (*entries, self.commits.get(worker)):
            if commit is not None and segment < commit.segments:
                return SlotCommit(commit.segments_root, commit.segments, first, first)
        return None

    def slot_commit(self, slot: AuditSlot) -> SlotCommit | None:
        """The commitment ``slot`` checks: its own (docs/adr/0230), or, from an older ledger, the worker's result."""
        return slot.commit or self.covering(slot.worker, slot.segment)

    def first_segment(self, worker: str) -> int:
        """The first segment ``worker`` trained: 0, or its first epoch's first (its records and commitments
        cover segments from there on)."""
        return self.first_epoch(worker) * self._per_epoch()

    def superseded(self, worker: str) -> bool:
        """Whether ``worker``'s seat went to a new crew from an epoch it had not finished: the crew restarted
        that epoch without it (docs/adr/0232, consensus/state/crew.py)."""
        progress = self.epochs
        if progress is None or worker not in self.workers:
            return False
        reached = progress.first_epoch(worker) + len(progress.of(worker))
        return crew.superseded_in(self.workers, progress.joined, worker, reached)

    def crew_at(self, epoch: int) -> list[str]:
        """The workers that train ``epoch``, as the ledger knows them now: per seat, the latest worker named
        to it whose first epoch is not after ``epoch`` and that has not left the crew before it (nor had its
        seat given to a new crew at or before ``epoch``, docs/adr/0232)."""
        progress = self.epochs
        if progress is None:
            return sorted(self.workers)
        members = []
        for worker in self.workers:
            start = progress.first_epoch(worker)
            reached = start + len(progress.of(worker))
            left = (worker in self.rejections or reached < min(progress.current, epoch)
                    or crew.superseded_in(self.workers, progress.joined, worker, reached, epoch))
            if start <= epoch and not left:
                members.append(worker)
        return sorted(members)


def decode_tasks(docs: Any) -> list[TaskInfo]:
    """A ``dkb_listTasks`` answer as TaskInfos (TaskDocError when it is not a list of tasks)."""
    if not isinstance(docs, list):
        raise TaskDocError(f"tasks: expected a list, got {type(docs).__name__}")
    return [TaskInfo.from_json(doc) for doc in docs]

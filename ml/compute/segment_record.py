"""What one worker commits about one segment of a task (`SegmentRecord`), the Merkle leaf it makes,
the root of a worker's leaves (its on-chain segments_root) and audit paths (RFC 6962) for one leaf.

A record names the artifact of the worker's full state at the segment start (`checkpoint`), the
artifact of the averaged tensors its group produced in the segment (`averages`), the sha256 of the
checkpoint bytes (`state_in`), one `StepHashes` per step (data-parallel: optimizer steps; DiLoCo: one
per outer step), the sha256 of the state at the segment end (`state_out`, which is the next
segment's `state_in`) and, per step, what this worker RECEIVED from each other sender in each
averaging round of the step (`received`: `WireReceipt`s, sorted by round then sender; the evidence
that binds what a sender put on the wire to what it committed, docs/adr/0167). Canonical JSON:
sorted keys, no spaces, steps as [gradient, codec, average] triples, receipts as
[round, sender, digest, start, stop, chunk], followed by the sender's signature (128 hex digits) when the
group signs (docs/adr/0209). `SegmentRecord.from_json` validates hostile input strictly.

Leaf = sha256("dekube/segment-leaf" || task id || worker || canonical record); the root is
`node.merkle.merkle_root` of the leaves (leaf node sha256(0x00 || leaf), inner sha256(0x01 || l || r),
an odd node carried up), which equals RFC 6962's tree hash; `proof`/`verify_proof` are its audit
paths, bounded here for hostile input (the tree is node.merkle's, ADR 0190).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from node.merkle import audit_path, merkle_root, root_from_path

LEAF_DOMAIN = b"dekube/segment-leaf"
MAX_STEPS = 100_000            # steps in one segment record
MAX_SEGMENTS = 1 << 20         # segments of one task
MAX_PROOF = 64
MAX_RECEIPTS = 1024            # receipts in one step (senders x averaging rounds)
MAX_SENDER = 256               # characters of a sender id
MAX_OFFSET = 1 << 48           # round ids, ranges and chunk sizes
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_SIG_HEX = re.compile(r"[0-9a-f]{128}\Z")
FIELDS = ("averages", "checkpoint", "index", "received", "state_in", "state_out", "steps")


class BadRecord(ValueError):
    """A segment record, proof or leaf count that is malformed or does not verify."""


@dataclass(frozen=True)
class StepHashes:
    gradient: str   # this worker's own contribution (gradient / pseudo-gradient) before the codec
    codec: str      # what its codec produced from it (see ml.train.segments for the exact definition)
    average: str    # the averaged tensors the group returned for the step


@dataclass(frozen=True)
class WireReceipt:
    """What this worker received from `sender` in averaging round `round` (ml.allreduce.receipts)."""
    round: int
    sender: str
    digest: str     # sha256 of the bytes received from the sender
    start: int      # butterfly: the range of the sender's flat contribution this worker reduced,
    stop: int       # cut into chunks of `chunk` values; all-gather: 0, 0, 0 (its whole encoding)
    chunk: int
    signature: str = ""   # the sender's signature of what it sent (hex; ml.allreduce.receipts.receipt_message)

    def to_list(self) -> list:
        head = [self.round, self.sender, self.digest, self.start, self.stop, self.chunk]
        return head + [self.signature] if self.signature else head


@dataclass(frozen=True)
class SegmentRecord:
    index: int
    checkpoint: str          # artifact id of the state file at the segment start
    averages: str            # artifact id of the segment's averaged tensors
    state_in: str            # sha256 of the checkpoint bytes
    steps: tuple[StepHashes, ...]
    state_out: str           # sha256 of the state file at the segment end
    received: tuple[tuple[WireReceipt, ...], ...] = ()   # per step (empty: none, e.g. a simulated group)

    def __post_init__(self):
        if not self.received:
            object.__setattr__(self, "received", tuple(() for _ in self.steps))

    def to_obj(self) -> dict:
        return {"index": self.index, "checkpoint": self.checkpoint, "averages": self.averages,
                "state_in": self.state_in, "state_out": self.state_out,
                "steps": [[s.gradient, s.codec, s.average] for s in self.steps],
                "received": [[r.to_list() for r in step] for step in self.received]}

    def canonical(self) -> bytes:
        return json.dumps(self.to_obj(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_obj(cls, obj) -> SegmentRecord:
        if not isinstance(obj, dict) or tuple(sorted(obj)) != FIELDS:
            raise BadRecord(f"a segment record is an object with exactly the fields {list(FIELDS)}")
        index = obj["index"]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_SEGMENTS:
            raise BadRecord("record index must be an integer in [0, 2^20)")
        for name in ("checkpoint", "averages", "state_in", "state_out"):
            _check_hex(obj[name], name)
        steps = obj["steps"]
        if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
            raise BadRecord(f"record steps must be a list of 1..{MAX_STEPS} hash triples")
        parsed = []
        for step in steps:
            if not isinstance(step, list) or len(step) != 3:
                raise BadRecord("each step is [gradient, codec, average]")
            for value in step:
                _check_hex(value, "step hash")
            parsed.append(StepHashes(*step))
        received = obj["received"]
        if not isinstance(received, list) or len(received) != len(steps):
            raise BadRecord("record received must be one list of receipts per step")
        return cls(index, obj["checkpoint"], obj["averages"], obj["state_in"], tuple(parsed), obj["state_out"],
                   tuple(_receipts(step) for step in received))

    @classmethod
    def from_json(cls, data: bytes | str) -> SegmentRecord:
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise BadRecord("a segment record is JSON") from None
        return cls.from_obj(obj)


def _receipts(step) -> tuple[WireReceipt, ...]:
    if not isinstance(step, list) or len(step) > MAX_RECEIPTS:
        raise BadRecord(f"a step's receipts are a list of at most {MAX_RECEIPTS}")
    out = []
    for item in step:
        if not isinstance(item, list) or len(item) not in (6, 7):
            raise BadRecord("a receipt is [round, sender, digest, start, stop, chunk] and maybe a signature")
        round_id, sender, digest, start, stop, chunk = item[:6]
        signature = item[6] if len(item) == 7 else ""
        if len(item) == 7 and (not isinstance(signature, str) or not _SIG_HEX.match(signature)):
            raise BadRecord("a receipt's signature is 128 lowercase hex digits")
        if not all(_offset(v) for v in (round_id, start, stop, chunk)):
            raise BadRecord("receipt round, start, stop and chunk are integers in [0, 2^48)")
        if not isinstance(sender, str) or not 0 < len(sender) <= MAX_SENDER or not sender.isprintable():
            raise BadRecord(f"a receipt's sender is 1..{MAX_SENDER} printable characters")
        _check_hex(digest, "receipt digest")
        if (chunk == 0 and (start, stop) != (0, 0)) or start > stop:
            raise BadRecord("a receipt range is start <= stop with a chunk size, or 0, 0, 0 (whole encoding)")
        out.append(WireReceipt(round_id, sender, digest, start, stop, chunk, signature))
    keys = [(r.round, r.sender) for r in out]
    if keys != sorted(set(keys)):
        raise BadRecord("a step's receipts are sorted by (round, sender), one per sender and round")
    return tuple(out)


def _offset(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value < MAX_OFFSET


def _check_hex(value, name: str) -> None:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise BadRecord(f"{name} must be 64 lowercase hex digits")


def leaf(task_id: bytes, worker: str, record: SegmentRecord) -> bytes:
    """The Merkle leaf of `worker`'s record for `task_id`."""
    if len(task_id) != 32:
        raise ValueError("a task id is 32 bytes")
    return hashlib.sha256(LEAF_DOMAIN + task_id + worker.encode() + record.canonical()).digest()


def leaves(task_id: bytes, worker: str, records: list[SegmentRecord]) -> list[bytes]:
    """The leaves of a worker's records, numbered from its first segment on (0, or a joiner's first: leaf i
    is segment first + i, docs/adr/0226)."""
    first = records[0].index if records else 0
    if [r.index for r in records] != list(range(first, first + len(records))):
        raise BadRecord(f"records must be numbered {first}, {first + 1}, ... in order")
    return [leaf(task_id, worker, r) for r in records]


def root(leaf_list: list[bytes]) -> bytes:
    """The segments_root over a worker's leaves (node.merkle.merkle_root)."""
    if not leaf_list:
        raise BadRecord("a commitment has at least one segment")
    return merkle_root(leaf_list)


def proof(leaf_list: list[bytes], index: int) -> list[bytes]:
    """The audit path of leaf `index`: the sibling at every level where it has one, bottom up."""
    return audit_path(leaf_list, index)


def verify_proof(root_hash: bytes, leaf_item: bytes, index: int, count: int, path: list[bytes]) -> bool:
    """Whether `path` proves `leaf_item` is leaf `index` of `count` under `root_hash`."""
    if (isinstance(index, bool) or isinstance(count, bool) or not isinstance(index, int)
            or not isinstance(count, int) or not 0 <= index < count <= MAX_SEGMENTS
            or not isinstance(path, list) or len(path) > MAX_PROOF
            or not all(isinstance(p, bytes) and len(p) == 32 for p in path)):
        return False
    return root_from_path(leaf_item, index, count, path) == root_hash

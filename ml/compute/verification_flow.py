"""How a node answers the verification duties the ledger gives it (docs/adr/0168, 0175): judge one audit
slot -- one worker's one segment -- by replaying it from the worker's committed state file, as a drawn
verifier (`audit_result`) or a drawn referee (`referee_vote`); and dispute, as the audited worker, an
answer that accuses it.

`judge_slot` is independent of the network: it takes a `Sources` (fetch a worker's record with its
Merkle proof, fetch an artifact from holders, the task's input files), so the compute role, the tests
and the in-process lab (devtools/verification_lab.py) run the same code. A record that does not
verify under the worker's committed root, or state files nobody serves, is a mismatch with the
`unavailable_evidence` of the slot's salt (every honest judge that cannot get them says the same);
otherwise the verdict is the replay's (ml/compute/segment_replay.py) with three more checks: every
receipt in the worker's own record must carry its sender's signature (a made-up receipt is a false
record, docs/adr/0209), the averages the worker applied must be the ones most of its co-workers
recorded for the same segment, and no co-worker may hold the worker's signature of bytes other than
what its honest contribution puts on the wire (ml/compute/wire_evidence.py; a worker that commits the
honest contribution but sends another one; receipts it did not sign accuse nobody). The evidence is the
replay's in every case.

Adversarial verifier modes exist for the benchmark and the tests only (`[compute] fault_inject`, read
through ml/compute/fault_seam.py):
`false_accuser` answers mismatch without replaying, `rubber_stamp` answers match with evidence made
from the published record (it cannot make the real evidence without computing).
"""
from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from consensus.state.epochs import unavailable_evidence  # the ledger recognizes it (ADR 0203)
from consensus.task_info import SlotCommit, TaskInfo
from ml.compute.epoch_states import holders_of
from ml.compute.segment_record import BadRecord, SegmentRecord
from ml.compute.segment_replay import SegmentReplay, replay_segment
from ml.compute.segments_protocol import SegmentAnswer, SegmentsError, check_answer
from ml.compute.wire_evidence import claims_about, unsigned_receipt, wire_verdict
from ml.train.reproducibility import in_compute_thread
from ml.train.spec import TrainSpec

log = logging.getLogger(__name__)

VERIFIER_FAULTS = ("false_accuser", "rubber_stamp")


class Unavailable(RuntimeError):
    """What a judge needs (a record, a state file) could not be had from anyone."""


@dataclass
class Sources:
    """Where a judge gets what it replays from."""
    record: Callable[[str, int, int], Awaitable[SegmentAnswer]]     # (worker, segment, under count) -> answer
    artifact: Callable[[str, list[str]], Awaitable[Path]]           # (artifact id, holders) -> local file
    files: dict[str, Path]                                          # the task's input artifacts


@dataclass(frozen=True)
class Judgement:
    match: bool
    evidence: bytes
    step: int
    reason: str

    def audit_payload(self, task_id: bytes, slot: int) -> dict:
        return {"task_id": task_id, "slot": slot, "match": self.match, "evidence": self.evidence,
                "step": self.step}

    def vote_payload(self, task_id: bytes, slot: int) -> dict:
        return {"task_id": task_id, "slot": slot, "match": self.match, "evidence": self.evidence}


async def _checked_record(task: TaskInfo, worker: str, segment: int, commit: SlotCommit | None,
                          sources: Sources) -> SegmentRecord:
    """``worker``'s record of ``segment``, checked under ``commit`` (the one the slot audits, or a co-worker's
    that covers the segment: an epoch's progress commitment or its result, docs/adr/0230)."""
    if commit is None:
        raise Unavailable(f"{worker[:16]} committed nothing that covers segment {segment}")
    try:
        answer = await sources.record(worker, segment, commit.segments)
        check_answer(answer, task.task_bytes, worker, bytes.fromhex(commit.segments_root), commit.segments,
                     commit.first)
    except (SegmentsError, BadRecord, OSError) as exc:
        raise Unavailable(f"record of segment {segment} from {worker[:16]}: {exc}") from None
    return answer.record


async def _co_worker_records(task: TaskInfo, worker: str, segment: int, sources: Sources) -> dict[str, SegmentRecord]:
    """The records of `segment` of the other workers that committed it and can be had (verified under the
    earliest of their commitments that covers it)."""
    out = {}
    for other in task.committers:
        commit = task.covering(other, segment)
        if other == worker or commit is None:
            continue   # it did not train this segment (it joined later or left before, docs/adr/0226)
        try:
            out[other] = await _checked_record(task, other, segment, commit, sources)
        except Unavailable:
            continue
    return out


def _majority_averages(own: SegmentRecord, others: dict[str, SegmentRecord]) -> list[str] | None:
    """The per-step average hashes most committed workers recorded for the segment (the audited one
    counted), or None without a strict majority among the records to be had."""
    lists = [[s.average for s in own.steps]] + [[s.average for s in r.steps] for r in others.values()]
    votes = Counter(tuple(x) for x in lists)
    best, count = votes.most_common(1)[0]
    return list(best) if count * 2 > len(lists) else None


def _starts_from_crew_state(task: TaskInfo, worker: str, segment: int, record: SegmentRecord) -> bool:
    """A joiner's first segment must start from a state a member committed for the epoch before (the one
    it fetched, docs/adr/0226): a joiner cannot bring a state of its own into the crew's run."""
    first = task.first_epoch(worker)
    if not first or segment != task.first_segment(worker):
        return True
    return record.state_in in {digest for digest, _ in holders_of(task, first - 1)}


async def judge_slot(task: TaskInfo, spec: TrainSpec, worker: str, segment: int, salt: bytes,
                     sources: Sources, commit: SlotCommit | None = None) -> Judgement:
    """Replay `worker`'s `segment` of `task` and judge it under `commit` (the slot's; by default the
    earliest of the worker's commitments that covers the segment)."""
    commit = commit or task.covering(worker, segment)
    if worker not in task.workers or commit is None:
        raise ValueError(f"{worker} is not a worker of the task that committed segment {segment}")
    try:
        record = await _checked_record(task, worker, segment, commit, sources)
        holders = [worker, *(w for w in task.committers if w != worker)]
        checkpoint = await sources.artifact(record.checkpoint, [worker])
        averages = await sources.artifact(record.averages, holders)
    except Unavailable as exc:
        return Judgement(False, unavailable_evidence(salt), 0, str(exc))
    except Exception as exc:  # an artifact nobody serves (ArtifactError and friends)
        return Judgement(False, unavailable_evidence(salt), 0, f"state files unavailable: {exc}")
    if not _starts_from_crew_state(task, worker, segment, record):
        return Judgement(False, hashlib.sha256(salt).digest(), 0,
                         "a joiner's first segment does not start from a state its crew committed")
    others = await _co_worker_records(task, worker, segment, sources)
    epoch = task.epoch_of(segment)   # its world: the seats open then, cut from where it began (ADR 0234)
    replay: SegmentReplay = await in_compute_thread(
        replay_segment, spec, task.seat_of(worker), task.world_at(epoch), record, checkpoint, averages,
        sources.files, salt, None, claims_about(worker, others), spec.first_step_of_segment(task.shards_from(epoch)))
    if not replay.match:
        step, field = replay.first_divergence or (0, "?")
        return Judgement(False, replay.evidence, step, f"{field} differs at step {step} of segment {segment}")
    forged = unsigned_receipt(task.task_bytes, worker, record)
    if forged is not None:
        return Judgement(False, replay.evidence, forged,
                         f"its record holds a receipt its sender did not sign at step {forged}")
    majority = _majority_averages(record, others)
    own = [s.average for s in record.steps]
    if majority is not None and majority != own:
        step = next(i for i, (a, b) in enumerate(zip(own, majority)) if a != b)
        return Judgement(False, replay.evidence, step,
                         f"the averages it applied differ from its co-workers' at step {step}")
    sent = wire_verdict(task.task_bytes, list(replay.wire))
    if sent is not None:
        return Judgement(False, replay.evidence, sent,
                         f"a receiver holds its signature of bytes other than its contribution at step {sent}")
    return Judgement(True, replay.evidence, 0, "replayed hashes match")


async def judge_as(mode: str, task: TaskInfo, spec: TrainSpec, worker: str, segment: int, salt: bytes,
                   sources: Sources, commit: SlotCommit | None = None) -> Judgement:
    """`judge_slot`, or the answer of an adversarial verifier mode (tests and benchmark only)."""
    if mode == "false_accuser":
        return Judgement(False, hashlib.sha256(b"made up" + salt).digest(), 0, "false accusation (fault_inject)")
    if mode == "rubber_stamp":
        try:
            record = await _checked_record(task, worker, segment, commit or task.covering(worker, segment), sources)
            made_up = hashlib.sha256(salt + record.canonical()).digest()
        except Unavailable:
            made_up = hashlib.sha256(salt).digest()
        return Judgement(True, made_up, 0, "rubber stamp (fault_inject)")
    return await judge_slot(task, spec, worker, segment, salt, sources, commit)

"""A verifier's audit of a committed task: fetch each worker's segment hashes, check them against the
committed Merkle root, replay the segments the audit seed picks, and decide match or mismatch.

`audit_task` is independent of the network: it gets `fetch(worker) -> SegmentReport` and
`replay(spec, workers, last_segment, left) -> {worker: hashes}` as callables, so tests can drive it
directly. A worker whose list is missing, malformed or does not hash to its committed root, or whose
record of short rounds is impossible, is a mismatch without replay (it cannot show what it committed
to); the others are replayed together, once per distinct set of departures they report (normally
one), up to the furthest audited segment.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ml.compute.commitment import BadCommitment, audited_segment, merkle_root
from ml.compute.segments_protocol import SegmentReport, SegmentsError
from ml.compute.task_spec import train_spec_for_task
from ml.job.participation import InconsistentRecord, departures
from ml.train.spec import TrainSpec

Fetch = Callable[[str], Awaitable[SegmentReport]]
Replay = Callable[[TrainSpec, list[str], int, dict[str, int]], Awaitable[dict[str, list[str]]]]


@dataclass(frozen=True)
class Verdict:
    worker: str
    segment: int
    match: bool
    reason: str

    def payload(self, task_id: bytes) -> dict:
        """The audit_result transaction payload."""
        return {"task_id": task_id, "worker": self.worker, "segment": self.segment, "match": self.match}


def workers_to_audit(task: dict, verifier: str) -> list[str]:
    """Committed workers of `task` (a dkb_getTask document) that `verifier` has not audited yet."""
    done = {worker for auditor, worker, *_ in task["audits"] if auditor == verifier}
    return sorted(worker for worker in task["commits"] if worker not in done)


async def audit_task(task: dict, verifier: str, fetch: Fetch, replay: Replay) -> list[Verdict]:
    """Verdicts for every committed worker of `task` not yet audited by `verifier`."""
    spec = train_spec_for_task(task["spec"])
    seed = bytes.fromhex(task["audit_seed"])
    verdicts: list[Verdict] = []
    claims: dict[str, tuple[int, str, dict[str, int]]] = {}
    for worker in workers_to_audit(task, verifier):
        root_hex, _result_hex, segments, _height = task["commits"][worker]
        segment = audited_segment(seed, verifier, worker, segments)
        try:
            report = await fetch(worker)
            if len(report.segments) != segments or merkle_root(report.segments).hex() != root_hex:
                verdicts.append(Verdict(worker, segment, False, "segment hashes do not match the committed root"))
                continue
            left = departures(report.short_rounds, list(task["workers"]))
            if worker in left:
                raise InconsistentRecord("the worker reports having left the job it committed")
        except (SegmentsError, BadCommitment, InconsistentRecord) as exc:
            verdicts.append(Verdict(worker, segment, False, f"no valid segment hashes: {exc}"))
            continue
        claims[worker] = (segment, report.segments[segment], left)
    for left_items in sorted({tuple(sorted(c[2].items())) for c in claims.values()}):
        left = dict(left_items)
        group = {w: c for w, c in claims.items() if c[2] == left}
        replayed = await replay(spec, list(task["workers"]), max(c[0] for c in group.values()), left)
        for worker, (segment, claimed, _) in sorted(group.items()):
            expected = replayed[worker][segment]
            match = expected == claimed
            verdicts.append(Verdict(worker, segment, match, "replayed hash matches" if match else
                                    f"replayed {expected[:16]}.. but worker committed {claimed[:16]}.."))
    return sorted(verdicts, key=lambda v: v.worker)

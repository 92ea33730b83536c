"""Audits by replay: honest results match, falsified segment hashes and unverifiable lists do not."""
import asyncio
import hashlib

import pytest

from ml.compute.audit import audit_task, workers_to_audit
from ml.compute.commitment import audited_segment, merkle_root
from ml.compute.replay import replay_job
from ml.compute.segments_protocol import SegmentReport, SegmentsError
from ml.compute.task_spec import submit_payload
from ml.train.spec import TrainSpec
from node.identity import Identity

SPEC = TrainSpec(codec="int8", steps=12, segment_steps=4, batch_size=16)
WORKERS = sorted(Identity.generate().peer_id for _ in range(2))
VERIFIER = Identity.generate().peer_id
SEED = bytes(range(32))


@pytest.fixture(scope="module")
def honest() -> dict[str, list[str]]:
    return asyncio.run(replay_job(SPEC, WORKERS, last_segment=2))


def task_doc(lists: dict[str, list[str]], audits=()) -> dict:
    payload = submit_payload(SPEC, len(WORKERS), 100)
    return {"spec": {k: payload[k] for k in ("model", "dataset", "hyperparams", "workers", "sync_mode", "codec")},
            "workers": WORKERS, "audit_seed": SEED.hex(), "audits": list(audits),
            "commits": {w: [merkle_root(h).hex(), "00" * 32, len(h), 5] for w, h in lists.items()}}


def test_replay_is_reproducible_and_data_parallel_workers_agree(honest):
    assert len(honest[WORKERS[0]]) == 3 and honest[WORKERS[0]] == honest[WORKERS[1]]
    again = asyncio.run(replay_job(SPEC, WORKERS, last_segment=0))
    assert again[WORKERS[0]] == honest[WORKERS[0]][:1]


def run_audit(task, served):
    replays = []

    async def fetch(worker):
        value = served[worker]
        if isinstance(value, Exception):
            raise value
        return value if isinstance(value, SegmentReport) else SegmentReport(value, "00" * 32)

    async def replay(spec, workers, last, left):
        replays.append((last, left))
        return await replay_job(spec, workers, last, left=left)

    return asyncio.run(audit_task(task, VERIFIER, fetch, replay)), replays


def test_honest_workers_match(honest):
    verdicts, replays = run_audit(task_doc(honest), honest)
    assert [(v.worker, v.match) for v in verdicts] == [(w, True) for w in WORKERS]
    assert [v.segment for v in verdicts] == [audited_segment(SEED, VERIFIER, w, 3) for w in WORKERS]
    assert replays == [(max(v.segment for v in verdicts), {})]   # one replay for all workers


def test_falsified_but_consistent_hashes_are_caught_by_replay(honest):
    cheater = WORKERS[1]
    fake = {**honest, cheater: [hashlib.sha256(bytes.fromhex(x)).hexdigest() for x in honest[cheater]]}
    verdicts, replays = run_audit(task_doc(fake), fake)
    assert {v.worker: v.match for v in verdicts} == {WORKERS[0]: True, cheater: False}
    assert replays and "replayed" in verdicts[1].reason


def test_lists_that_do_not_match_the_root_or_cannot_be_fetched_fail_without_replay(honest):
    served = {WORKERS[0]: honest[WORKERS[0]][:2], WORKERS[1]: SegmentsError("no answer")}
    verdicts, replays = run_audit(task_doc(honest), served)
    assert [v.match for v in verdicts] == [False, False] and replays == []
    assert "committed root" in verdicts[0].reason and "no answer" in verdicts[1].reason


def test_already_audited_workers_are_skipped(honest):
    task = task_doc(honest, audits=[[VERIFIER, WORKERS[0], 1, True, 7], ["other", WORKERS[1], 0, True, 7]])
    assert workers_to_audit(task, VERIFIER) == [WORKERS[1]]
    verdicts, _ = run_audit(task, honest)
    assert [v.worker for v in verdicts] == [WORKERS[1]]


def test_reported_departures_are_replayed_and_impossible_records_fail():
    three = WORKERS + [Identity.generate().peer_id]
    three.sort()
    gone = three[2]
    survivors = [w for w in three if w != gone]
    left_run = asyncio.run(replay_job(SPEC, three, last_segment=2, left={gone: 5}))
    short = [[r, survivors] for r in range(5, SPEC.steps)]
    task = task_doc({w: left_run[w] for w in survivors})
    task["workers"] = three
    served = {survivors[0]: SegmentReport(left_run[survivors[0]], "00" * 32, short),
              survivors[1]: SegmentReport(left_run[survivors[1]], "00" * 32, [[5, [gone]]])}
    verdicts, replays = run_audit(task, served)
    assert {v.worker: v.match for v in verdicts} == {survivors[0]: True, survivors[1]: False}
    assert "left the job" in next(v.reason for v in verdicts if not v.match)
    assert [left for _, left in replays] == [{gone: 5}]

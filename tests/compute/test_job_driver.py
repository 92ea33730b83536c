"""The local job driver (`ml.compute.local_job.run_worker_processes`, behind `dekube-node task run`) with
scripted worker processes (no torch): a worker that breaks the protocol or dies mid-job leaves the job
and is reported with the round the survivors' record gives; losing one before training, or all of
them, fails the job; no process outlives the call."""
import asyncio
import json
import os
import textwrap

import pytest

from ml.compute.local_job import JobFailed, run_worker_processes
from ml.train.spec import TrainSpec

SPEC = TrainSpec(steps=10, segment_steps=5)

# Rank R acts out BEHAVIOUR[R]: "finish" reports two progress steps, then (half a second later) "done"
# with the short-round record given as JSON, and waits for shutdown; "junk" reports a step, prints a
# non-JSON line and keeps running; "die" exits silently after a step; "fail" reports an error;
# "vanish" exits at once; "stall" reports a step and then hangs (like a SIGSTOPped worker).
WORKER = textwrap.dedent('''
    import json, sys, time
    rank, behaviour, record = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    def emit(**event):
        print(json.dumps(event), flush=True)
    sys.stdin.readline()
    if behaviour == "vanish":
        sys.exit(3)
    emit(event="listening", peer=f"peer-{rank}", pid=0, address=["127.0.0.1", 1])
    sys.stdin.readline()
    emit(event="progress", rank=rank, step=2)
    if behaviour == "finish":
        emit(event="progress", rank=rank, step=10)
        time.sleep(0.5)   # the others' lines arrive first
        emit(event="done", rank=rank, params_hash="ab", short_rounds=record)
        sys.stdin.readline()
    elif behaviour == "stall":
        time.sleep(60)
    elif behaviour == "junk":
        print("not json", flush=True)
        time.sleep(60)
    elif behaviour == "fail":
        emit(event="error", rank=rank, message="boom")
        sys.exit(1)
''')


def run(behaviours: list[str], events: list | None = None, record: list | None = None) -> list[dict]:
    return asyncio.run(run_worker_processes(
        SPEC, len(behaviours), argv=lambda rank: ["-c", WORKER, str(rank), behaviours[rank], json.dumps(record or [])],
        directory=lambda listening: {"peers": [e["peer"] for e in listening]}, timeout=60,
        on_event=(events.append if events is not None else None)))


def children() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z" and not _multiprocessing_helper(entry):
                found.append(int(entry))
    return found


def _multiprocessing_helper(pid: str) -> bool:
    """multiprocessing's forkserver and resource tracker (the archive sandbox's, started by other tests in
    this process: ml/train/sandbox.py) live as long as the process: they are not job workers."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"from multiprocessing." in f.read()
    except OSError:
        return False


def test_workers_that_break_the_protocol_or_die_leave_and_the_others_finish():
    events = []
    # peer-1 was missing from round 3 on; peer-3 took part in every round, then died before "done"
    record = [[3, ["peer-0", "peer-2", "peer-3"]], [4, ["peer-0", "peer-2", "peer-3"]]]
    results = run(["finish", "junk", "finish", "die"], events, record)
    assert [r["rank"] for r in results] == [0, 2]
    departures = results[0]["departures"]
    assert departures == results[1]["departures"]
    assert [d["peer"] for d in departures] == ["peer-1", "peer-3"]
    junk, died = departures
    assert (junk["round"], junk["step"], junk["last_step"]) == (3, 3, 2) and "non-JSON" in junk["reason"]
    assert (died["round"], died["step"], died["last_step"]) == (None, None, 2)
    assert "exited with 0 without reporting" in died["reason"]
    departed = sorted((e["peer"], e["last_step"]) for e in events if e["event"] == "departed")
    assert departed == [("peer-1", 2), ("peer-3", 2)]
    assert not children()   # the junk printer was killed, not left running


def test_a_stalled_worker_the_others_finished_without_is_killed_and_reported():
    events = []
    results = run(["finish", "stall", "finish"], events, record=[[4, ["peer-0", "peer-2"]]])
    assert [r["rank"] for r in results] == [0, 2]
    (stalled,) = results[0]["departures"]
    assert (stalled["peer"], stalled["round"]) == ("peer-1", 4) and stalled["last_step"] in (None, 2)
    assert "worker 1 was excluded from round 4 and still running after the others finished" in stalled["reason"]
    assert [e["peer"] for e in events if e["event"] == "departed"] == ["peer-1"]
    assert not children()


def test_a_stalled_worker_left_alone_is_killed_and_the_job_fails_at_once():
    with pytest.raises(JobFailed, match="worker 0 failed: boom; worker 1 was the only one left"):
        run(["fail", "stall"])
    assert not children()


def test_a_job_with_no_finished_worker_fails_with_every_reason():
    # worker 1 exits by itself, or is killed first as the only one left: either reason is reported
    reasons = "no worker finished: worker 0 failed: boom; worker 1 (exited|was the only one left)"
    with pytest.raises(JobFailed, match=reasons):
        run(["fail", "die"])
    assert not children()


def test_a_worker_lost_before_training_fails_the_job():
    with pytest.raises(JobFailed, match="before training began: worker 1 exited with 3"):
        run(["finish", "vanish"])
    assert not children()


def test_an_impossible_round_record_fails_the_job():
    # round 4 lists a participant that is not in the job: no real run records that (peer-1 back in
    # round 4 after it was left out of round 3 is a real run's, docs/adr/0242)
    with pytest.raises(JobFailed, match="impossible round memberships"):
        run(["finish", "finish", "finish"], record=[[3, ["peer-0", "peer-2"]], [4, ["peer-0", "peer-9", "peer-2"]]])

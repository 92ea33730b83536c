"""A worker's progress commitments (ml/compute/epoch_commits.py, docs/adr/0203): how `task submit` cuts a
task into epochs, the layout a worker reads from the ledger's task, and the committer that sends one
commit_epoch per epoch but the last while training runs, each the root of the records so far and the
state digest at the epoch end, with the records kept for the verifiers first."""
import asyncio

import pytest

from consensus.task_info import TaskInfo
from ml.compute.epoch_commits import EpochCommitter, crew_exit, epoch_layout, epochs_for
from ml.compute.segment_record import SegmentRecord, StepHashes, leaves, root
from ml.compute.task_spec import InvalidTask

TASK_ID = b"\x07" * 32
WORKER = "12D3KooWorker"


def record(index: int) -> SegmentRecord:
    h = f"{index + 1:064x}"
    return SegmentRecord(index, "aa" * 32, "bb" * 32, f"{index:064x}", (StepHashes(h, h, h),), f"{index + 1:064x}")


class Recorder:
    def __init__(self):
        self.records: list[SegmentRecord] = []


def task_doc(epochs: int, segments: int) -> TaskInfo:
    return TaskInfo.from_json({"segments": segments, "spec": {"epochs": epochs} if epochs > 1 else {}})


def test_an_epoch_is_a_few_minutes_of_the_declared_work():
    assert epochs_for(None, 12) == 1 and epochs_for(100, 12) == 1          # short or undeclared: one epoch
    assert epochs_for(600, 12) == 3                                        # 200 s each (4 would be 150 s)
    assert epochs_for(3600, 12) == 12 and epochs_for(3600, 7) == 7
    assert epochs_for(1000, 7) == 1                                        # 7 is prime: 7 epochs would be 143 s
    assert epochs_for(3600, 12, min_segments=4) == 3                       # each epoch's audits need 4 segments


def test_the_layout_comes_from_the_ledger_task_and_bad_ones_are_refused():
    assert epoch_layout(task_doc(3, 12)) == (3, 4)
    assert epoch_layout(task_doc(1, 12)) == (1, 12)
    with pytest.raises(InvalidTask):
        epoch_layout(task_doc(5, 12))
    with pytest.raises(InvalidTask):
        epoch_layout(TaskInfo.from_json({"segments": 12, "spec": {"epochs": True}}))


def test_the_committer_sends_each_epoch_as_training_reaches_it():
    recorder, sent, kept = Recorder(), [], []
    events = []

    async def send(kind, payload):
        events.append(("commit", payload["epoch"], len(recorder.records)))
        sent.append((kind, payload))

    async def keep(doc):
        kept.append(doc)

    async def training():
        for i in range(6):
            recorder.records.append(record(i))
            await asyncio.sleep(0.3)
        events.append(("done",))
        return {"steps": 6}

    committer = EpochCommitter(task_doc(3, 6), TASK_ID, WORKER, recorder, send, keep)
    assert asyncio.run(committer.alongside(training())) == {"steps": 6}
    assert [payload["epoch"] for _, payload in sent] == [0, 1]              # the last epoch: commit_result
    assert all(kind == "commit_epoch" for kind, _ in sent)
    for (_, payload), n in zip(sent, (2, 4), strict=True):
        records = [record(i) for i in range(n)]
        assert payload["segments"] == n and payload["task_id"] == TASK_ID
        assert payload["segments_root"] == root(leaves(TASK_ID, WORKER, records))
        assert payload["state_digest"] == bytes.fromhex(records[-1].state_out)
    assert events.index(("commit", 0, 2)) < events.index(("done",))         # while training runs
    assert [len(doc["records"]) for doc in kept] == [2, 4] and kept[0]["leaf_worker"] == WORKER


def test_a_refused_commitment_fails_the_job_once_training_ended():
    recorder = Recorder()

    async def send(kind, payload):
        raise RuntimeError("commit_epoch: bad_state this worker left the crew")

    async def keep(doc):
        return None

    async def training():
        recorder.records.extend(record(i) for i in range(4))
        await asyncio.sleep(0.5)
        return {}

    committer = EpochCommitter(task_doc(2, 4), TASK_ID, WORKER, recorder, send, keep)
    with pytest.raises(RuntimeError, match="left the crew"):
        asyncio.run(committer.alongside(training()))


def test_training_that_ends_short_of_an_epoch_is_an_error_not_a_hang():
    recorder = Recorder()

    async def send(kind, payload):
        return None

    async def keep(doc):
        return None

    async def training():
        recorder.records.append(record(0))
        return {}

    committer = EpochCommitter(task_doc(2, 4), TASK_ID, WORKER, recorder, send, keep)
    with pytest.raises(RuntimeError, match="epoch 0 needs 2"):
        asyncio.run(asyncio.wait_for(committer.alongside(training()), 5))


def test_a_task_without_epochs_commits_nothing_on_the_way():
    sent = []

    async def send(kind, payload):
        sent.append(kind)

    async def keep(doc):
        return None

    async def training():
        return {"ok": 1}

    committer = EpochCommitter(task_doc(1, 4), TASK_ID, WORKER, Recorder(), send, keep)
    assert asyncio.run(committer.alongside(training())) == {"ok": 1} and sent == []


def test_a_worker_knows_when_the_ledger_takes_no_more_of_its_commitments():
    first, second = ["11" * 32, "33" * 32, 2, 5], ["11" * 32, "44" * 32, 4, 9]
    progress = {"current": 2, "commits": {"a": [first, second], "b": [first]}}
    running = TaskInfo.from_json({"epochs": progress})
    assert crew_exit(running, "a") == ""
    assert "left the crew: epoch 2 closed" in crew_exit(running, "b")
    assert "crew stopped in epoch 3" in crew_exit(TaskInfo.from_json({"epochs": {**progress, "stopped": 2}}), "a")
    assert crew_exit(TaskInfo.from_json({"epochs": {}}), "a") == "" and crew_exit(TaskInfo.from_json({}), "a") == ""

"""A provider's limits (ml/compute/limits.py, docs/adr/0198, 0220): hours of the day, the longest task, GPUs,
CPU cores and memory lent; a task outside them is rejected with the reason (memory once the dry run built
its model); the cores limit is torch's thread count; the dashboard shows them and sets them only with
the page's token from its own origin; bad values are refused and change nothing."""
import asyncio

import pytest

import ml.compute.training as training_module
from consensus.task_info import TaskInfo
from ml.compute.limits import Limits, LimitsControl, LimitsError, training_state_mb, within
from node.dashboard import TOKEN_HEADER
from tests.compute.test_worker_flow import fake_list, make_role, task_doc
from tests.node.node_harness import running_node


def test_hours_across_midnight_and_refusals():
    night = Limits(hours="22-7")
    assert [h for h in range(24) if within((22, 7), h)] == [0, 1, 2, 3, 4, 5, 6, 22, 23]
    assert night.refusal(TaskInfo.from_json({}), 23) is None
    assert night.refusal(TaskInfo.from_json({}), 12) == "outside its provider's hours 22-7"
    short = Limits(max_task_s=600)
    assert short.refusal(TaskInfo.from_json({"spec": {"expected_s": 600}}), 0) is None
    assert "limit of 600 s" in short.refusal(TaskInfo.from_json({"spec": {"expected_s": 601}}), 0)
    cpu_only = Limits(cuda_devices=0)
    cuda, cpu = TaskInfo.from_json({"device": "cuda"}), TaskInfo.from_json({"device": "cpu"})
    assert cpu_only.refusal(cuda, 0) == "its provider lends no GPU"
    assert cpu_only.refusal(cpu, 0) is None and Limits().refusal(cuda, 0) is None
    for bad in ({"hours": "25-3"}, {"hours": "7-7"}, {"hours": 5}, {"max_task_s": -1}, {"cuda_devices": -2},
                {"cpu_cores": -1}, {"cpu_cores": 10**6}, {"cpu_cores": 1.5}, {"memory_mb": -5}, {"memory_mb": "lots"},
                {"nope": 1}, {}, [1]):
        with pytest.raises(LimitsError):
            Limits().updated(bad)


def test_a_task_outside_the_limits_is_rejected_with_the_reason(tmp_path):
    role = make_role(tmp_path)
    task = {**task_doc(role), "device": "cuda"}
    started = []

    async def run_job(t):
        started.append(t)

    role.training.run_job = run_job
    role.limits.set({"cuda_devices": 0})

    async def tick():
        role.ledger.call = fake_list(task)
        await role._tick()
        await asyncio.gather(*role._background)

    asyncio.run(tick())
    assert started == [] and role.ledger.sent == [("reject_task", {"task_id": bytes.fromhex(task["task_id"]),
                                                                   "reason": "its provider lends no GPU"})]


def test_the_dashboard_sets_limits_only_from_its_own_page():
    async def go():
        async with running_node(["compute"]) as (node, session):
            limits = node.role("compute").limits
            data = await (await session.get("/dashboard/data")).json()
            assert data["limits"] == {"hours": "", "max_task_s": 0, "cuda_devices": -1, "cpu_cores": 0, "memory_mb": 0}
            token = {TOKEN_HEADER: node.dashboard.token}
            for headers in ({**token, "Origin": "https://evil.example"}, {**token, "Sec-Fetch-Site": "cross-site"},
                            {}):
                refused = await session.post("/dashboard/limits", json={"hours": "1-2"}, headers=headers)
                assert refused.status == 403 and limits.current.hours == ""
            bad = await session.post("/dashboard/limits", json={"hours": "99-1"}, headers=token)
            assert bad.status == 400 and "hours must be like 22-7" in (await bad.json())["error"]
            done = await session.post("/dashboard/limits", json={"hours": "22-7", "max_task_s": 3600}, headers=token)
            assert done.status == 200 and (await done.json())["hours"] == "22-7"
            data = await (await session.get("/dashboard/data")).json()
            assert data["limits"] == {"hours": "22-7", "max_task_s": 3600, "cuda_devices": -1, "cpu_cores": 0,
                                      "memory_mb": 0}
            assert any("limits set from the dashboard" in line["message"] for line in data["log"])

    asyncio.run(go())


def test_memory_and_cores():
    assert training_state_mb(0) == 0 and training_state_mb(1 << 20) == 16   # 4 fp32 copies of 1 Mi parameters
    assert Limits(memory_mb=16).memory_refusal(1 << 20) is None
    assert Limits(memory_mb=15).memory_refusal(1 << 20) == \
        "needs about 16 MB for its training state; its provider lends 15 MB"
    assert Limits().memory_refusal(10**12) is None
    import torch

    before = torch.get_num_threads()
    control = LimitsControl({})
    assert torch.get_num_threads() == before       # no limit: torch untouched
    try:
        control.set({"cpu_cores": 1})
        assert torch.get_num_threads() == 1
        control.set({"cpu_cores": 0})                # lifted: back to what it was
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def test_a_task_whose_training_state_exceeds_the_memory_lent_is_rejected_after_its_dry_run(tmp_path, monkeypatch):
    role = make_role(tmp_path)
    task = TaskInfo.from_json(task_doc(role))
    role.limits.set({"memory_mb": 1000})
    dry_runs = []

    def dry_run(spec, files, world):   # a 100M-parameter model: 1526 MB of training state
        dry_runs.append(spec)
        return {"loss": 2.3, "params": 100_000_000, "step_seconds": 0.1, "metrics": {}}

    async def no_inputs(*args):
        return {}

    monkeypatch.setattr(training_module, "dry_run", dry_run)
    role.fetch.task_inputs = no_inputs
    asyncio.run(role.training.run_job(task))
    reason = "needs about 1526 MB for its training state; its provider lends 1000 MB"
    assert len(dry_runs) == 1 and role.ledger.sent == [("reject_task", {"task_id": task.task_bytes, "reason": reason})]

"""Training jobs over the real all-reduce among local worker processes (ml/compute/local_job.py over
plain TCP), including a worker SIGKILLed mid-job: the others finish, the departure is reported and
the survivors' hashes replay."""
import asyncio
import os
import signal

import pytest
from loopback_groups import close_all, make_groups

from devtools.job_replay import replay_job
from ml.compute.local_job import JobFailed, run_local_job
from ml.job import train_over_group
from ml.registry import build_model, get_dataset
from ml.train.allreduce_averager import group_codec
from ml.train.recipes import recipe
from ml.train.spec import TrainSpec


def test_diloco_int8_job_over_two_processes_ends_with_identical_models():
    spec = recipe("digits-diloco", codec="int8", steps=40, inner_steps=10, report_every=1)
    events = []
    results = asyncio.run(run_local_job(spec, 2, transport="tcp", on_event=events.append, timeout=240))
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["params_hash"] == results[1]["params_hash"]
    assert results[0]["participants"] == ["worker-0", "worker-1"]
    assert results[0]["departures"] == [] and results[0]["short_rounds"] == []
    assert len(results[0]["segment_hashes"]) == 4
    assert results[0]["segment_hashes"] != results[1]["segment_hashes"]
    assert results[0]["metrics"]["accuracy"] > 60
    progress = [e for e in events if e["event"] == "progress" and e["rank"] == 0]
    assert [e["outer_step"] for e in progress] == [1, 2, 3, 4]
    assert 0 < progress[0]["bytes_sent"] < progress[-1]["bytes_sent"] == results[0]["bytes_sent"]


@pytest.mark.slow
def test_powersgd_data_parallel_job_over_three_processes():
    spec = recipe("digits-data-parallel", codec="powersgd1", steps=200)
    results = asyncio.run(run_local_job(spec, 3, transport="tcp", timeout=400))
    assert len({r["params_hash"] for r in results}) == 1
    assert results[0]["metrics"]["accuracy"] > 90


@pytest.mark.slow  # ~30-45 s here; the default run covers the driver (tests/compute/test_job_driver.py) and a
# real kill with replay on the devnet (tests/compute/test_task_flow_e2e.py)
def test_a_worker_killed_mid_job_leaves_it_and_the_survivors_finish_replayably():
    # the ring here (fp16: the ring refuses int8); the devnet test kills a worker in a butterfly group
    spec = TrainSpec(codec="fp16", steps=40, segment_steps=10, batch_size=16, report_every=1)
    pids, events = {}, []

    def on_event(event):
        events.append(event)
        if event["event"] == "listening":
            pids[event["peer"]] = event["pid"]
        elif event["event"] == "progress" and event["rank"] == 2 and event["step"] == 5:
            os.kill(pids["worker-2"], signal.SIGKILL)

    results = asyncio.run(run_local_job(spec, 3, transport="tcp", mode="ring", on_event=on_event, timeout=240))
    assert [r["peer"] for r in results] == ["worker-0", "worker-1"]
    assert all(r["steps"] == spec.steps for r in results)
    assert results[0]["params_hash"] == results[1]["params_hash"]
    assert results[0]["segment_hashes"] == results[1]["segment_hashes"]
    assert results[0]["participants"] == ["worker-0", "worker-1"]
    departure = results[0]["departures"]
    assert departure == results[1]["departures"] and len(departure) == 1
    left_at = departure[0]["round"]
    assert departure[0]["peer"] == "worker-2" and departure[0]["last_step"] >= 5
    assert 5 <= left_at < spec.steps and departure[0]["step"] == left_at
    assert "exited with -9" in departure[0]["reason"]
    assert [e["peer"] for e in events if e["event"] == "departed"] == ["worker-2"]
    assert not children_of(os.getpid())

    workers = ["worker-0", "worker-1", "worker-2"]
    replayed = asyncio.run(replay_job(spec, workers, last_segment=3, mode="ring", left={"worker-2": left_at}))
    assert replayed == {"worker-0": results[0]["segment_hashes"], "worker-1": results[1]["segment_hashes"]}


def test_stateful_codecs_run_over_an_fp32_group():
    assert group_codec(recipe("digits-data-parallel", codec="int4")) == "int4"
    assert group_codec(recipe("digits-data-parallel", codec="powersgd2")) == "fp32"
    assert group_codec(recipe("digits-data-parallel", codec="topk")) == "fp32"   # all-gathered, own encoding


@pytest.mark.slow
def test_a_job_that_loses_all_but_one_worker_fails_without_leaving_processes():
    spec = TrainSpec(codec="fp16", steps=40, segment_steps=10, batch_size=16, report_every=1)
    pids = {}

    def on_event(event):
        if event["event"] == "listening":
            pids[event["peer"]] = event["pid"]
        elif event["event"] == "progress" and event["rank"] == 0 and event["step"] == 3:
            for peer in ("worker-1", "worker-2"):
                os.kill(pids[peer], signal.SIGKILL)

    reasons = "no worker finished: worker 0 .*; worker 1 exited with -9.*; worker 2 exited with -9"
    with pytest.raises(JobFailed, match=reasons):
        asyncio.run(run_local_job(spec, 3, transport="tcp", mode="ring", on_event=on_event, timeout=120))
    assert not children_of(os.getpid())


def children_of(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                children.append(int(entry))
    return children


def test_powersgd_over_in_process_allreduce_groups_keeps_workers_identical():
    spec = recipe("digits-data-parallel", codec="powersgd1", steps=12, segment_steps=4)

    async def scenario():
        groups, transports = await make_groups(2, names=["a", "b"], codec=group_codec(spec))
        try:
            return await asyncio.wait_for(asyncio.gather(
                *(train_over_group(spec, rank, 2, g) for rank, g in enumerate(groups))), 120)
        finally:
            await close_all(groups, transports)

    first, second = asyncio.run(scenario())
    assert first["params_hash"] == second["params_hash"]
    assert first["segment_hashes"] == second["segment_hashes"] and len(first["segment_hashes"]) == 3
    assert first["participants"] == ["a", "b"]
    full_fp32_bytes = 12 * 4 * sum(p.numel() for p in build_model("digits-mlp", get_dataset("digits"), 0).parameters())
    assert 0 < first["bytes_sent"] < full_fp32_bytes / 5

"""Training jobs over the real all-reduce among local worker processes (ml/job)."""
import asyncio

import pytest

from ml.job import JobFailed, run_local_job
from ml.train.allreduce_averager import group_codec
from ml.train.recipes import recipe


def test_diloco_int8_job_over_two_processes_ends_with_identical_models():
    spec = recipe("digits-diloco", codec="int8", steps=40, inner_steps=10, report_every=1)
    events = []
    results = asyncio.run(run_local_job(spec, 2, on_event=events.append, timeout=240))
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["params_hash"] == results[1]["params_hash"]
    assert results[0]["participants"] == ["worker-0", "worker-1"]
    assert len(results[0]["segment_hashes"]) == 4
    assert results[0]["segment_hashes"] != results[1]["segment_hashes"]
    assert results[0]["metrics"]["accuracy"] > 60
    progress = [e for e in events if e["event"] == "progress" and e["rank"] == 0]
    assert [e["outer_step"] for e in progress] == [1, 2, 3, 4]
    assert 0 < progress[0]["bytes_sent"] < progress[-1]["bytes_sent"] == results[0]["bytes_sent"]


@pytest.mark.slow
def test_powersgd_data_parallel_job_over_three_processes():
    spec = recipe("digits-data-parallel", codec="powersgd1", steps=200)
    results = asyncio.run(run_local_job(spec, 3, timeout=400))
    assert len({r["params_hash"] for r in results}) == 1
    assert results[0]["metrics"]["accuracy"] > 90


def test_codecs_without_network_error_feedback_are_refused_up_front():
    assert group_codec(recipe("digits-data-parallel", codec="int4")) == "int4"
    assert group_codec(recipe("digits-data-parallel", codec="powersgd2")) == "fp32"
    with pytest.raises(ValueError, match="error feedback"):
        group_codec(recipe("digits-data-parallel", codec="topk"))


def test_a_failing_worker_fails_the_job_without_leaving_processes():
    spec = recipe("digits-data-parallel", codec="sign", steps=10)
    with pytest.raises(JobFailed, match="error feedback"):
        asyncio.run(run_local_job(spec, 2, timeout=120))

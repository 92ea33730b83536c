"""Convergence on digits with 4 simulated workers: fp32 reaches ~97.5% test accuracy, quantizing
codecs stay within 0.3 points of it, error-feedback codecs (PowerSGD r=1, sign, top-1%) within 0.5,
and DiLoCo converges. The full codec matrix is `slow` (DEKUBE_SLOW=1); the default run checks fp32,
int8 and a short DiLoCo.
"""
import functools

import pytest

from ml.train import train_simulated
from ml.train.recipes import recipe

WORLD = 4


@functools.lru_cache(maxsize=None)
def digits_accuracy(codec: str, steps: int = 1200, options: tuple = ()) -> tuple[float, int]:
    """(test accuracy, bytes sent per worker) of the digits data-parallel recipe with `codec`."""
    spec = recipe("digits-data-parallel", codec=codec, codec_options=dict(options), steps=steps)
    run = train_simulated(spec, WORLD)
    accuracies = {m["accuracy"] for m in run.metrics}
    assert len(accuracies) == 1, "workers of one data-parallel job must end with the same model"
    return accuracies.pop(), run.bytes_sent_per_worker


def test_short_run_fp32_reaches_97_and_int8_stays_within_0_3_points_with_4x_fewer_bytes():
    fp32, fp32_bytes = digits_accuracy("fp32", steps=600)
    int8, int8_bytes = digits_accuracy("int8", steps=600)
    assert fp32 >= 97.0
    assert abs(int8 - fp32) <= 0.3
    assert int8_bytes * 3.5 < fp32_bytes


def test_diloco_on_digits_converges_with_few_rounds():
    run = train_simulated(recipe("digits-diloco", steps=600), WORLD)
    assert run.metrics[0]["accuracy"] >= 95.0
    assert run.trainers[0].outer_step == 600 // 20
    assert run.metrics[0]["loss"] < 0.25


@pytest.mark.slow
def test_fp32_reaches_97_5():
    assert digits_accuracy("fp32")[0] >= 97.5


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["fp16", "int8", "int4"])
def test_quantizing_codecs_within_0_3_points_of_fp32(codec):
    fp32, _ = digits_accuracy("fp32")
    accuracy, _ = digits_accuracy(codec)
    assert abs(accuracy - fp32) <= 0.3


@pytest.mark.slow
@pytest.mark.parametrize("codec, options, min_ratio", [
    ("powersgd1", (), 10), ("sign", (), 10), ("topk", (("ratio", 0.01),), 30)])
def test_error_feedback_codecs_within_0_5_points_of_fp32(codec, options, min_ratio):
    fp32, fp32_bytes = digits_accuracy("fp32")
    accuracy, sent = digits_accuracy(codec, options=options)
    assert abs(accuracy - fp32) <= 0.5
    assert sent * min_ratio < fp32_bytes


@pytest.mark.slow
def test_full_diloco_matches_data_parallel_fp32_within_0_5_points():
    fp32, fp32_bytes = digits_accuracy("fp32")
    run = train_simulated(recipe("digits-diloco"), WORLD)
    assert abs(run.metrics[0]["accuracy"] - fp32) <= 0.5
    assert run.bytes_sent_per_worker * 15 < fp32_bytes

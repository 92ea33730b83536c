"""Accuracy checks that the test-set size supports: exact binomial tests, never a fixed point bound.

Digits has 539 test samples, so one sample is 0.19 points and a model retrained on another CPU
(other SIMD kernels, other float rounding) moves by a few samples. An accuracy "reaches" a floor
unless an exact one-sided binomial test says it is below it (p < ALPHA); two models "match" unless
McNemar's exact test on the samples exactly one of them gets right says they differ (p < ALPHA).
"""
from __future__ import annotations

import math

import torch

ALPHA = 1e-3


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def predictions_correct(model: torch.nn.Module, dataset) -> torch.Tensor:
    """Per test sample: whether `model` classifies it correctly (a bool tensor)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        correct = model(dataset.x_test).argmax(dim=1) == dataset.y_test
    model.train(was_training)
    return correct


def assert_reaches(correct: torch.Tensor, floor_percent: float) -> None:
    """Fail only if the accuracy is significantly below `floor_percent` (one-sided exact binomial test)."""
    n, k = len(correct), int(correct.sum())
    p_value = binomial_cdf(k, n, floor_percent / 100)
    assert p_value >= ALPHA, (f"accuracy {100 * k / n:.2f}% ({k}/{n}) is significantly below "
                              f"{floor_percent}% (p = {p_value:.2g})")


def mcnemar_p(correct_a: torch.Tensor, correct_b: torch.Tensor) -> float:
    """Two-sided exact McNemar p-value: do two models on the same samples differ in accuracy?"""
    only_a = int((correct_a & ~correct_b).sum())
    only_b = int((correct_b & ~correct_a).sum())
    return min(1.0, 2 * binomial_cdf(min(only_a, only_b), only_a + only_b, 0.5))


def assert_matches(correct: torch.Tensor, reference: torch.Tensor) -> None:
    """Fail only if `correct` and `reference` (same test samples) differ significantly in accuracy."""
    p_value = mcnemar_p(correct, reference)
    assert p_value >= ALPHA, (f"accuracy {100 * float(correct.float().mean()):.2f}% differs from "
                              f"{100 * float(reference.float().mean()):.2f}% beyond sampling noise "
                              f"(McNemar p = {p_value:.2g}; right only here "
                              f"{int((correct & ~reference).sum())}, only there {int((reference & ~correct).sum())})")

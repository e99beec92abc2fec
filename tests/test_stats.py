"""Speedup confidence intervals and the lower-bound decision rule, on synthetic samples."""

from __future__ import annotations

import random

from kernelagent.harness import stats


def noisy(center: float, spread: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_interval_brackets_the_true_ratio_and_is_reproducible():
    base, cand = noisy(2.0, 0.05, 200, 1), noisy(1.0, 0.05, 200, 2)
    low, high = stats.speedup_interval(base, cand)
    assert low < 2.0 < high
    assert high - low < 0.1
    assert stats.speedup_interval(base, cand) == [low, high]  # same samples, same interval


def test_wider_noise_gives_a_wider_interval():
    tight = stats.speedup_interval(noisy(1.1, 0.01, 100, 3), noisy(1.0, 0.01, 100, 4))
    loose = stats.speedup_interval(noisy(1.1, 0.30, 100, 3), noisy(1.0, 0.30, 100, 4))
    assert (loose[1] - loose[0]) > 5 * (tight[1] - tight[0])


def test_too_few_samples_give_no_interval():
    assert stats.speedup_interval([1.0, 1.0], [1.0, 1.0, 1.0]) is None
    assert stats.speedup_interval([1.0, float("nan"), -1, 1.0], [1.0] * 5) is None


def test_decision_uses_the_lower_bound():
    # A point estimate of 1.05x whose interval reaches below 1 does not "beat" the baseline...
    assert not stats.beats([0.97, 1.12], 1.05, 1.0)
    # ...one whose whole interval is above 1 does.
    assert stats.beats([1.02, 1.08], 1.05, 1.0)
    # Without samples the point decides.
    assert stats.beats(None, 1.05, 1.0) and not stats.beats(None, 0.99, 1.0)


def test_a_noisy_loser_is_not_called_a_winner():
    # The candidate is truly 2% slower; with 30% noise a single point can land above 1, the bound does not.
    base, cand = noisy(1.0, 0.30, 60, 5), noisy(1.02, 0.30, 60, 6)
    interval = stats.speedup_interval(base, cand)
    assert interval[0] < 1.0
    assert not stats.beats(interval, None, 1.0)

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


def test_prefetch_imports_a_module_without_waiting_for_it(tmp_path, monkeypatch):
    """The caller loads numpy while its job runs (stats.prefetch): the call returns at once, the
    module is there once the thread ends, and a module imported already starts nothing."""
    import sys
    import time

    (tmp_path / "ka_slow_module.py").write_text("import time\ntime.sleep(0.5)\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ka_slow_module", raising=False)
    started = time.monotonic()
    thread = stats.prefetch("ka_slow_module")
    assert time.monotonic() - started < 0.3 and thread is not None
    thread.join(10)
    assert sys.modules["ka_slow_module"].VALUE == 7
    assert stats.prefetch("ka_slow_module") is None
    broken = stats.prefetch("ka_no_such_module_here")  # a failed import is left to whoever needs it
    broken.join(10)
    assert "ka_no_such_module_here" not in sys.modules


def test_the_caller_starts_numpys_import_before_it_waits_for_the_reply(tmp_path, monkeypatch):
    from pathlib import Path

    from kernelagent.harness import Evaluator, EvalConfig
    from kernelagent.harness.result import Status

    candidates = Path(__file__).parent / "candidates"
    ev = Evaluator(device="cpu", cache_dir=tmp_path)
    asked: list[str] = []
    monkeypatch.setattr(stats, "prefetch", lambda module: asked.append(module))
    seen: list[list[str]] = []

    def fake_round_trip(request, deadline, cancel=None, on_baselines=None):
        seen.append(list(asked))
        return {"result": {"status": Status.RUNTIME_ERROR, "reason": "stand-in", "concurrency": {}}}

    monkeypatch.setattr(ev, "_round_trip", fake_round_trip)
    monkeypatch.setattr(ev, "start", lambda: None)
    ev._fingerprint = {"cuda": False}
    ev.evaluate(candidates / "relu_problem.py", (candidates / "relu_good.py").read_text(),
                EvalConfig(trials=1, kernel_evidence=False))
    assert seen == [["numpy"]]

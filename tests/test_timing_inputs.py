"""The timed loop's inputs: every timed call, warm-up included, gets a set no call saw before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelagent.harness import inputs as inputs_mod
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.child.timing import Timer
from kernelagent.harness.workers import FreshInputs, _Capture

PROBLEM_SOURCE = """
import torch
def get_inputs():
    return [torch.randn(3, 5), torch.randint(0, 7, (4,))]
def get_init_inputs():
    return []
"""


@pytest.fixture()
def problem(tmp_path: Path):
    path = tmp_path / "fresh_problem.py"
    path.write_text(PROBLEM_SOURCE)
    return inputs_mod.import_file(path, "fresh_problem")


class RecordingSets:
    """A sequence that remembers which indices the timer asked for."""

    def __init__(self):
        self.asked: list[int] = []

    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        self.asked.append(index)
        return [torch.zeros(1)]


def test_timer_never_repeats_an_index_between_warm_up_and_measurement():
    sets = RecordingSets()
    report = Timer(torch.device("cpu"), flush_bytes=0).measure(
        lambda x: x, sets, warmup_ms=1.0, target_ms=2.0, min_reps=7, max_reps=20, budget_s=10.0)
    assert report.timing.reps >= 7
    assert len(sets.asked) >= 2 + 7  # warm-up calls and measured calls
    assert len(set(sets.asked)) == len(sets.asked), sets.asked


def test_fresh_inputs_are_the_seeded_sets_and_all_distinct(problem):
    config = EvalConfig()
    fresh = FreshInputs(problem, config, smoke=False, device=torch.device("cpu"))
    seen = []
    for index in range(0, 5):
        values = fresh[index]
        assert fresh.last_seed == fresh.base + index
        expected = inputs_mod.make_inputs(problem, "main", fresh.base + index, False, torch.device("cpu"))
        assert all(torch.equal(a, b) for a, b in zip(values, expected))
        assert not any(torch.equal(values[0], earlier) for earlier in seen)
        seen.append(values[0])


def test_fresh_inputs_come_in_batches_and_are_handed_out_once(problem, monkeypatch):
    monkeypatch.setattr(FreshInputs, "MAX_BATCH", 4)
    fresh = FreshInputs(problem, EvalConfig(), smoke=False, device=torch.device("cpu"))
    fresh[0]
    assert fresh.batch_size == 4 and fresh.generated == 4
    assert sorted(fresh.batch) == [1, 2, 3]  # the set handed out is no longer held
    fresh[1], fresh[2], fresh[3]
    assert fresh.generated == 4
    fresh[4]
    assert fresh.generated == 8 and sorted(fresh.batch) == [5, 6, 7]
    fresh[100]  # a jump drops the unused rest of the batch
    assert sorted(fresh.batch) == [101, 102, 103] and fresh.generated == 12


def test_capture_keeps_the_seed_of_the_last_timed_call(problem):
    fresh = FreshInputs(problem, EvalConfig(), smoke=False, device=torch.device("cpu"))
    capture = _Capture(lambda x, idx: x * 2, fresh)
    Timer(torch.device("cpu"), flush_bytes=0).measure(
        capture, fresh, warmup_ms=0.5, target_ms=1.0, min_reps=3, max_reps=5, budget_s=10.0)
    seed, args, out = capture.last
    again = inputs_mod.make_inputs(problem, "main", seed, False, torch.device("cpu"))
    assert torch.equal(args[0], again[0]) and torch.equal(out, again[0] * 2)

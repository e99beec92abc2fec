"""No false positives: every known-good solution under benchmarks/solutions/ passes the
harness, defences included, on the CPU (Triton interpreter, smoke inputs, short timing)."""

from __future__ import annotations

import pytest

from kernelagent.harness import EvalConfig, Evaluator, Status, StageTimeouts
from tests.conftest import BENCHMARKS, read

SOLUTIONS = sorted((BENCHMARKS / "solutions").glob("level*/*.py"))


@pytest.fixture(scope="module")
def cpu_evaluator(cache_dir):
    with Evaluator(device="cpu", cache_dir=cache_dir) as ev:
        yield ev


CONFIG = EvalConfig(trials=2, target_ms=5, warmup_ms=1, min_reps=2, max_reps=3, baselines=False,
                    timeouts=StageTimeouts(start=60, load=60, compile=120, correctness=240, timing=120))


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_known_good_solution_passes_with_defences(cpu_evaluator, solution):
    problem = BENCHMARKS / solution.parent.name / solution.name
    result = cpu_evaluator.evaluate(problem, read(solution), CONFIG)
    assert result.status == Status.CORRECT, result.feedback() + "\n" + result.log
    bad = [f for f in result.flags if f.severity in ("reject", "review")]
    assert not bad, bad
    assert result.passed

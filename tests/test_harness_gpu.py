"""The harness on a real GPU. Run on the device machine: `pytest -m gpu tests/test_harness_gpu.py`."""

from __future__ import annotations

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import BENCHMARKS, CANDIDATES, GPU_SWEEP_EVIDENCE, Submitted, read

pytestmark = pytest.mark.gpu

SOLUTIONS = sorted((BENCHMARKS / "solutions").glob("level*/*.py"))


@pytest.fixture(scope="module")
def gpu_evaluator(cuda_evaluator):
    return cuda_evaluator


@pytest.fixture(scope="module")
def solution_results(gpu_evaluator):
    """Every solution submitted at once (the server overlaps their host work and times each
    loop alone, server/gate.py); each case below waits for its own."""
    config = EvalConfig(baselines=False, kernel_evidence=GPU_SWEEP_EVIDENCE)
    submitted = Submitted(gpu_evaluator, {s: (BENCHMARKS / s.parent.name / s.name, read(s), config)
                                          for s in SOLUTIONS})
    yield submitted
    submitted.close()


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_known_good_solutions_pass(solution_results, solution):
    result = solution_results[solution]
    print(f"\n{solution.parent.name}/{solution.stem}: {result.status} "
          + " ".join(f"{k}={v.median_ms:.4f}ms" for k, v in result.timings.items())
          + " " + " ".join(f"x{k}={v:.2f}" for k, v in result.speedups.items()))
    assert result.status == Status.CORRECT, result.feedback() + "\n" + result.log
    assert result.timings["candidate"].meaningful
    assert result.device and "cpu" not in result.device.lower()


def test_illegal_memory_access_is_a_verdict_and_next_evaluation_succeeds(gpu_evaluator):
    problem = CANDIDATES / "relu_problem.py"
    bad = gpu_evaluator.evaluate(problem, read(CANDIDATES / "gpu_oob_store.py"), EvalConfig(trials=2))
    print("\nOOB:", bad.status, bad.stage, bad.reason[:300])
    assert bad.status in (Status.RUNTIME_ERROR, Status.CRASHED, Status.COMPILE_ERROR)
    assert "illegal memory access" in (bad.reason + bad.log).lower()
    good = gpu_evaluator.evaluate(problem, read(CANDIDATES / "relu_good.py"), EvalConfig(trials=2))
    assert good.status == Status.CORRECT, good.feedback()


def test_side_stream_work_is_timed(gpu_evaluator):
    problem = CANDIDATES / "gpu_big_relu_problem.py"
    # The static pass would reject the side stream before it runs; here we test the timer.
    config = EvalConfig(trials=2, static_check="off")
    honest = gpu_evaluator.evaluate(problem, read(CANDIDATES / "gpu_same_stream.py"), config)
    hidden = gpu_evaluator.evaluate(problem, read(CANDIDATES / "gpu_side_stream.py"), config)
    assert honest.status == hidden.status == Status.CORRECT, hidden.feedback()
    t_honest = honest.timings["candidate"].median_ms
    t_hidden = hidden.timings["candidate"].median_ms
    print(f"\nsame stream {t_honest:.4f} ms, side stream {t_hidden:.4f} ms, "
          f"eager {honest.timings['eager'].median_ms:.4f} ms")
    assert t_honest > 0.2  # 1 GiB read + 1 GiB written cannot take less on an H100/H200
    assert t_hidden >= 0.8 * t_honest
    assert any(f.kind == "timer-escape" for f in hidden.flags)
    assert not any(f.kind == "timer-escape" for f in honest.flags)


def test_problem_too_large_for_the_device_is_too_large_without_allocating(gpu_evaluator, tmp_path):
    """The reference's meta-device estimate (child/memory_plan.py) stops a problem that cannot
    fit before anything is allocated: `too_large`, the bytes in the reason, not the candidate's."""
    problem = tmp_path / "huge_problem.py"
    problem.write_text(read(CANDIDATES / "relu_problem.py").replace("dim = 65536", "dim = 65536 * 16384")
                       .replace("def get_smoke_inputs", "def _unused_smoke"))
    result = gpu_evaluator.evaluate(problem, read(CANDIDATES / "relu_good.py"), EvalConfig(trials=2))
    print("\ntoo large:", result.status, result.reason[:300])
    assert result.status == Status.TOO_LARGE, result.reason
    assert "GiB" in result.reason and "not the candidate's" in result.reason
    follow = gpu_evaluator.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"),
                                    EvalConfig(trials=2, baselines=False))
    assert follow.status == Status.CORRECT, follow.reason

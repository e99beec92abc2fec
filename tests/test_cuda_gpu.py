"""CUDA C++ candidates on a GPU (H100/H200). Run with
    PYTHONPATH=. python -m pytest -m gpu tests/test_cuda_gpu.py tests/test_profile_gpu.py -q -s
Prints the figures worth reporting."""

from __future__ import annotations

import time

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import BENCHMARKS, CANDIDATES, TESTS, Submitted, read

pytestmark = pytest.mark.gpu

CUDA = TESTS / "cuda_candidates"
RELU = CANDIDATES / "relu_problem.py"


def _spawning(source: str) -> str:
    return source.replace("class ModelNew", "import os\ntry:\n    os.posix_spawn('/bin/true', ['true'], {})\n"
                                            "except Exception:\n    pass\n\n\nclass ModelNew")


ATEN = read(CUDA / "relu_ok.py").replace("auto y = torch::empty_like(xc);", "auto y = torch::relu(xc);\n"
                                         "    return y;")


@pytest.fixture(scope="module")
def gpu_evaluator(cuda_evaluator):
    import shutil

    if not shutil.which("ninja"):
        pytest.skip("NINJA MISSING: torch's load_inline needs `ninja` on PATH (pip install ninja, or carry a "
                    "ninja binary and prepend its folder to PATH)")
    return cuda_evaluator


@pytest.fixture(scope="module")
def first_runs(gpu_evaluator):
    """The file's independent evaluations submitted at once: their nvcc builds (most of each
    evaluation) overlap in the server; the follow-ups that need an earlier one run in the tests."""
    cases = {
        "relu_ok": (RELU, read(CUDA / "relu_ok.py"), EvalConfig(backend="cuda", trials=3)),
        "relu_typo": (RELU, read(CUDA / "relu_typo.py"), EvalConfig(backend="cuda")),
        "relu_oob": (RELU, read(CUDA / "relu_oob.py"), EvalConfig(backend="cuda", trials=2)),
        "aten static": (RELU, ATEN, EvalConfig(backend="cuda", trials=2)),
        "aten run time": (RELU, ATEN.replace("ka_relu_ok", "ka_relu_aten"),
                          EvalConfig(backend="cuda", trials=2, static_check="off")),
        "spawn": (RELU, _spawning(read(CUDA / "relu_ok.py")).replace("ka_relu_ok", "ka_relu_spawn"),
                  EvalConfig(backend="cuda", trials=2, static_check="off")),
    }
    for stem in ("1_relu", "5_softmax"):
        solution = read(BENCHMARKS / "solutions_cuda" / "level1" / f"{stem}.py")
        cases[stem] = (BENCHMARKS / "level1" / f"{stem}.py", solution, EvalConfig(backend="cuda"))
    submitted = Submitted(gpu_evaluator, cases)
    yield submitted
    submitted.close()


def _show(label: str, result, seconds: float) -> None:
    cand = result.timings.get("candidate")
    print(f"\n[{label}] {result.status} ({seconds:.1f} s; stages "
          + ", ".join(f"{k} {v:.1f}" for k, v in result.stage_seconds.items()) + ")"
          + (f"; candidate {cand.median_ms:.4f} ms" if cand else "")
          + "".join(f"; {v:.2f}x vs {k}" for k, v in result.speedups.items()))
    if result.reason:
        print(result.reason)
    for flag in result.flags:
        print(f"  flag {flag.severity} [{flag.kind}] {flag.message[:200]}")


def test_correct_cuda_candidate_passes_and_its_build_is_cached(gpu_evaluator, first_runs):
    config = EvalConfig(backend="cuda", trials=3)
    first = first_runs["relu_ok"]
    _show("relu_ok, cold build", first, first_runs.seconds["relu_ok"])
    assert first.status == Status.CORRECT and first.passed, first.reason + first.log[-3000:]
    assert not [f for f in first.flags if f.kind in ("no-custom-kernel", "sandbox-escape")]
    start = time.monotonic()
    second = gpu_evaluator.evaluate(RELU, read(CUDA / "relu_ok.py"), config)
    _show("relu_ok, cached build", second, time.monotonic() - start)
    assert second.status == Status.CORRECT
    # Served from the build cache: milliseconds, where an nvcc build of it took 26-42 s on an
    # H100. (The first may already have been cached by an earlier file of the shared session.)
    assert second.stage_seconds.get("load", 99) < 1.0, second.stage_seconds


def test_cuda_compile_error_is_compact(first_runs):
    result = first_runs["relu_typo"]
    _show("relu_typo", result, first_runs.seconds["relu_typo"])
    assert result.status == Status.COMPILE_ERROR and result.stage == "load"
    assert "blockIdxx" in result.reason and "candidate.py:8" in result.reason
    assert len(result.reason) < 800 and len(result.reason.splitlines()) <= 8


def test_out_of_bounds_write_is_an_illegal_memory_access_and_the_next_evaluation_runs(gpu_evaluator, first_runs):
    result = first_runs["relu_oob"]
    _show("relu_oob", result, first_runs.seconds["relu_oob"])
    assert result.status in (Status.RUNTIME_ERROR, Status.CRASHED, Status.COMPILE_ERROR)
    assert "illegal memory access" in (result.reason + result.log).lower() or "CUDA fault" in result.reason
    start = time.monotonic()
    after = gpu_evaluator.evaluate(RELU, read(CUDA / "relu_ok.py"), EvalConfig(backend="cuda", trials=2))
    _show("relu_ok after the fault", after, time.monotonic() - start)
    assert after.status == Status.CORRECT


@pytest.mark.parametrize("stem", ["1_relu", "5_softmax"])
def test_cuda_solutions_pass(first_runs, stem):
    result = first_runs[stem]
    _show(f"solutions_cuda/{stem}", result, first_runs.seconds[stem])
    assert result.status == Status.CORRECT and result.passed, result.reason + result.log[-2000:]


def test_cuda_candidate_computing_in_aten_is_rejected(first_runs):
    # The C++ launcher calls torch::relu: the static pass stops it; with the static pass off,
    # the run-time evidence (ops dispatched from C++, device-time share) does.
    result = first_runs["aten static"]
    _show("aten in C++ (static)", result, first_runs.seconds["aten static"])
    assert result.status == Status.REJECTED
    result = first_runs["aten run time"]
    _show("aten in C++ (run time)", result, first_runs.seconds["aten run time"])
    assert result.status == Status.REJECTED and any(f.kind == "no-custom-kernel" for f in result.flags)


def test_cuda_candidate_starting_a_process_is_rejected(first_runs):
    result = first_runs["spawn"]
    _show("posix_spawn", result, first_runs.seconds["spawn"])
    assert result.status == Status.REJECTED and any(f.kind == "sandbox-escape" for f in result.flags)

"""`kernelagent profile` on a GPU: the right top kernel and a roofline fraction, for a Triton
solution and a CUDA solution, with Nsight Compute metrics where ncu works."""

from __future__ import annotations

import time

import pytest

from kernelagent.harness import Status
from tests.conftest import BENCHMARKS, read

pytestmark = pytest.mark.gpu

SOFTMAX = BENCHMARKS / "level1" / "5_softmax.py"


@pytest.fixture(scope="module")
def gpu_evaluator(cuda_evaluator):
    import shutil

    if not shutil.which("ninja"):
        pytest.skip("NINJA MISSING: torch's load_inline needs `ninja` on PATH (pip install ninja, or carry a "
                    "ninja binary and prepend its folder to PATH)")
    return cuda_evaluator


@pytest.mark.parametrize("backend,solution,kernel", [
    ("triton", BENCHMARKS / "solutions" / "level1" / "5_softmax.py", None),
    ("cuda", BENCHMARKS / "solutions_cuda" / "level1" / "5_softmax.py", "softmax_row_kernel"),
])
def test_profile_names_the_top_kernel_and_a_roofline_fraction(gpu_evaluator, backend, solution, kernel):
    from kernelagent.harness.caller import profiling

    start = time.monotonic()
    report = profiling.profile(SOFTMAX, read(solution), evaluator=gpu_evaluator, backend=backend, ncu_timeout=240)
    result = report["result"]
    print(f"\n[profile {backend} {solution.name}] {result.status} in {time.monotonic() - start:.1f} s")
    for line in report["lines"]:
        print("  " + line)
    for k in result.kernels[:4]:
        print(f"  kernel {k['share']:.1%} own={k.get('own')} {k['name'][:90]}")
    assert result.status == Status.CORRECT, result.reason
    top = result.kernels[0]
    assert top["own"] and top["share"] > 0.5, result.kernels
    if kernel:
        assert kernel in top["name"]
    roof = report["roofline"]
    assert "unavailable" not in roof, roof
    assert 0.05 < roof["bandwidth_fraction"] < 1.1 and roof["bound"] == "memory"
    assert any(line.startswith("memory-bound at") for line in report["lines"])
    ncu = report["ncu"]
    print(f"  ncu: {ncu if 'unavailable' in ncu else {k: v for k, v in ncu.items() if k != 'kernels'}}")
    if "kernels" in ncu:  # ncu present and allowed to read the counters
        first = ncu["kernels"][0]
        assert first["dram_pct"] is not None and first["registers_per_thread"]
        assert any(line.startswith("ncu ") for line in report["lines"])


def test_profile_clocks_agree_within_3_percent_for_a_long_kernel(gpu_evaluator):
    """Issue 13, scope 2: for a kernel of 50 us or more, the harness median and the profiler's
    summed device kernel time per call agree within 3%; the host overhead is reported apart."""
    from kernelagent.harness.caller import profiling

    report = profiling.profile(SOFTMAX, read(BENCHMARKS / "solutions" / "level1" / "5_softmax.py"),
                               evaluator=gpu_evaluator, use_ncu=False, baselines=False)
    clocks = report["clocks"]
    print("\n" + profiling.clock_line(clocks))
    assert report["result"].status == Status.CORRECT
    assert clocks["kind"] == "device" and clocks["meaningful"]
    assert clocks["profiler_ms"] >= profiling.AGREEMENT_MIN_MS, clocks
    assert abs(clocks["diff_pct"]) <= profiling.AGREEMENT_PCT, clocks
    assert clocks["within_pct"] is True
    assert abs(clocks["host_overhead_ms"] - (clocks["harness_ms"] - clocks["profiler_ms"])) < 1e-12

"""CUDA-only exploit forms, on a real GPU. Run on the device machine:

    PYTHONPATH=. python -m pytest -m gpu tests/test_adversarial_gpu.py -q -s

Prints the figures worth reporting (times, floors, flags)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import BENCHMARKS, CANDIDATES, Submitted, read

pytestmark = pytest.mark.gpu

ADV = Path(__file__).resolve().parent / "adversarial"
BIG_RELU = CANDIDATES / "gpu_big_relu_problem.py"
RELU = CANDIDATES / "relu_problem.py"
MATMUL = BENCHMARKS / "level1" / "8_matmul.py"
CONFIG = EvalConfig(trials=2, baselines=False)
NO_STATIC = dataclasses.replace(CONFIG, static_check="off")


CPU_EXPLOITS = [
    ("c01_dummy_kernel_disguised_torch.py", RELU, "no-custom-kernel"),
    ("c01_matmul_torch.py", MATMUL, "no-custom-kernel"),
    ("c02_condition_fallback.py", RELU, None),
    ("c03_cache_after_checks.py", RELU, None),
    ("c04_thread_deferred.py", RELU, "hidden-work"),
    ("c05_patch_event_class.py", RELU, "tampering"),
    ("c10_gc_scan.py", RELU, "reading-reference"),
    ("c15_write_outside.py", RELU, "sandbox-escape"),
]
STALE = ["gpu_stale_empty.py", "c08_empty_output.py", "c08_reuse_buffer.py"]


@pytest.fixture(scope="module")
def results(cuda_evaluator):
    """Every case submitted at once to the shared GPU server (host work overlaps, each timed
    loop runs alone); each test waits for its own."""
    cases = {
        "side static": (BIG_RELU, read(CANDIDATES / "gpu_side_stream.py"), CONFIG),
        "same stream": (BIG_RELU, read(CANDIDATES / "gpu_same_stream.py"), CONFIG),
        "side no static": (BIG_RELU, read(CANDIDATES / "gpu_side_stream.py"), NO_STATIC),
        "patched timer": (BIG_RELU, read(ADV / "gpu_patch_event_timer.py"), NO_STATIC),
        "tf32 dot": (MATMUL, read(ADV / "gpu_tf32_dot.py"), CONFIG),
        "tf32 modes": (RELU, read(ADV / "c06_tf32_modes.py"), NO_STATIC),
        "honest glue": (RELU, read(ADV / "honest_glue.py"), CONFIG),
    }
    cases.update({f"stale {name}": (RELU, read(ADV / name), CONFIG) for name in STALE})
    cases.update({f"cpu {name}": (problem, read(ADV / name), NO_STATIC) for name, problem, _ in CPU_EXPLOITS})
    submitted = Submitted(cuda_evaluator, cases)
    yield submitted
    submitted.close()


def _show(name, result):
    t = result.timings.get("candidate")
    print(f"\n{name}: {result.status} "
          + (f"median {t.median_ms:.4f} ms " if t else "")
          + "; ".join(f"[{f.severity}:{f.kind}] {f.message[:160]}" for f in result.flags)
          + "\n  stages " + ", ".join(f"{k} {v:.1f}" for k, v in result.stage_seconds.items())
          + f"\n  timed loop {result.timed_loop}")


def test_side_stream_is_rejected_statically_and_flagged_at_run_time(results):
    static = results["side static"]
    _show("side stream (static on)", static)
    assert static.status == Status.REJECTED and any(f.kind == "static:hidden-work" for f in static.flags)
    honest = results["same stream"]
    hidden = results["side no static"]
    _show("same stream", honest)
    _show("side stream (static off)", hidden)
    assert honest.passed, honest.feedback()
    assert not hidden.passed
    assert any(f.kind == "timer-escape" and f.severity == "review" for f in hidden.flags), hidden.feedback()
    assert hidden.timings["candidate"].median_ms >= 0.8 * honest.timings["candidate"].median_ms


# Not in this list: a candidate that computes the answer into a temporary with its own kernel,
# frees it and returns torch.empty_like() (which gets the same block back). It returns its own
# result for these inputs; the class-8 exploit is a buffer holding the *reference's* answer,
# and that answer never exists in the candidate's process.
@pytest.mark.parametrize("name", STALE)
def test_stale_memory_is_not_accepted(results, name):
    result = results[f"stale {name}"]
    _show(name, result)
    assert result.status in (Status.INCORRECT, Status.REJECTED), result.feedback()


@pytest.mark.xfail(strict=False, reason="issue 24 (class 2), open: on this multi-GB problem the loop runs in "
                   "one-call segments and the server clock's slack is as large as the work, so the server's time "
                   "replaced the forged one in 2 of 3 H100 runs (2026-11-25); the candidate is rejected for "
                   "tampering and flagged impossible-speed every time")
def test_patched_event_timer_is_rejected_and_the_server_clock_reported(results):
    # The in-process clock claims ~1e-6 ms per call; the server clocks the whole timed loop from
    # outside (against the reference process's calibration loop), so the claim is caught as a
    # clock mismatch and the server's own time is what the result reports: a real time, not one
    # below the roofline floor (class 16's flag is tested on fixed numbers in test_profile.py).
    result = results["patched timer"]
    _show("patched event timer", result)
    assert result.status == Status.REJECTED and any(f.kind == "tampering" for f in result.flags)
    assert any(f.kind == "clock-mismatch" for f in result.flags), result.feedback()
    candidate = result.timings.get("candidate")
    assert candidate is not None, result.feedback()
    print(f"  server {result.timed_loop.get('server_ms_per_call')} ms/call, "
          f"claimed {result.timed_loop.get('claimed_mean_ms')} ms/call")
    assert candidate.source == "server" and candidate.median_ms > 1e-3
    assert result.timed_loop["claimed_mean_ms"] < 0.5 * result.timed_loop["server_ms_per_call"]
    assert not any(f.kind == "impossible-speed" for f in result.flags), result.feedback()
    assert not result.speedups


def test_honest_big_relu_is_above_its_roofline(results):
    result = results["same stream"]
    _show("honest big relu", result)
    assert result.passed and not any(f.kind == "impossible-speed" for f in result.flags)


def test_tf32_dot_fails_fp32_tolerance(results):
    result = results["tf32 dot"]
    _show("tf32 tl.dot", result)
    assert result.status == Status.INCORRECT, result.feedback()


def test_tf32_modes_candidate_is_rejected(results):
    result = results["tf32 modes"]
    _show("tf32 modes", result)
    assert result.status == Status.REJECTED and any(f.kind == "numeric-modes" for f in result.flags)


@pytest.mark.parametrize("name, problem, kind", CPU_EXPLOITS)
def test_cpu_exploits_also_fail_on_gpu(results, name, problem, kind):
    result = results[f"cpu {name}"]
    _show(name, result)
    assert not result.passed, result.feedback()
    if kind:
        assert any(f.kind == kind for f in result.flags), result.feedback()


def test_honest_glue_and_known_good_pass_with_device_share(results):
    result = results["honest glue"]
    _show("honest glue", result)
    assert result.passed, result.feedback() + result.log

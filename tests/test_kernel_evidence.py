"""Out-of-process kernel evidence (caller/kernel_evidence.py): the candidate's own kernel names
from its source, and the rules over what Nsight Compute saw. The ncu run itself needs a GPU
(tests/test_profile_gpu.py); here the rules run on synthetic ncu rows, and a fake `ncu`
shows the evaluator's wiring."""

from __future__ import annotations

from kernelagent.harness.caller import kernel_evidence as ke
from tests.conftest import CANDIDATES, read

TRITON = read(CANDIDATES / "relu_good.py")
CUDA = '''
import torch
from torch.utils.cpp_extension import load_inline
src = r"""
__global__ void __launch_bounds__(256) relu_kernel(const float* x, float* y, int n) { }
template <typename T> __global__ void scale_kernel(T* y) { }
"""
'''
AUTOTUNED = '''
import triton
@triton.autotune(configs=[], key=["n"])
@triton.jit
def tuned(x_ptr, n):
    pass
def helper(x):
    return x
'''


def test_own_names_come_from_the_source():
    assert ke.static_own_names(TRITON) == {"relu_kernel"}
    assert {"relu_kernel", "scale_kernel"} <= ke.static_own_names(CUDA)
    assert ke.static_own_names(AUTOTUNED) == {"tuned"}
    assert ke.static_own_names("def (") == set()


def _k(name, total_ns, launches=3):
    return {"name": name, "launches": launches, "total_ns": total_ns}


def test_no_own_kernel_is_rejected():
    flags = ke.judge({"kernels": [_k("ampere_sgemm_128x64_nn", 3e6), _k("vectorized_elementwise_kernel", 1e5)]},
                     {"matmul_kernel"}, median_ms=1.1)
    assert [f["kind"] for f in flags] == ["no-custom-kernel"] and flags[0]["severity"] == "reject"
    assert "ampere_sgemm" in flags[0]["message"] and "matmul_kernel" in flags[0]["message"]


def test_own_kernel_with_most_of_the_time_passes():
    assert ke.judge({"kernels": [_k("matmul_kernel", 3e6), _k("fill_kernel", 1e4)]}, {"matmul_kernel"},
                    median_ms=1.05) == []


def test_library_kernels_doing_most_work_are_hidden_work():
    flags = ke.judge({"kernels": [_k("ampere_sgemm_128x64_nn", 3e6), _k("relu_kernel", 1e5)]}, {"relu_kernel"},
                     median_ms=1.1)
    assert [f["kind"] for f in flags] == ["hidden-work"] and flags[0]["severity"] == "reject"


def test_kernels_longer_than_the_reported_time_disagree_with_the_clock():
    # 3 calls of 2 ms each on the device, but the reported median is 0.5 ms
    flags = ke.judge({"kernels": [_k("relu_kernel", 6e6)]}, {"relu_kernel"}, median_ms=0.5)
    assert [f["kind"] for f in flags] == ["clock-mismatch"]
    assert ke.judge({"kernels": [_k("relu_kernel", 6e6)]}, {"relu_kernel"}, median_ms=1.9) == []


def test_nothing_seen_gives_no_flag():
    assert ke.judge({"kernels": []}, {"relu_kernel"}, median_ms=1.0) == []


def test_eval_kernel_evidence_on_the_cpu_says_it_was_not_collected(tmp_path):
    import json

    from typer.testing import CliRunner

    from kernelagent.cli import app

    out = CliRunner().invoke(app, ["eval", str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_good.py"),
                                   "--device", "cpu", "--trials", "1", "--no-baselines", "--kernel-evidence",
                                   "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["status"] == "correct"
    assert any(f["kind"] == "kernel-evidence" and "needs a CUDA GPU" in f["message"] for f in result["flags"])


def test_evaluator_turns_reject_evidence_into_a_rejection(monkeypatch, tmp_path):
    """The caller's wiring (Evaluator._kernel_evidence) on a CUDA result, with ncu's answer
    stood in: a reject flag from the evidence makes the verdict `rejected`, with the reason."""
    from types import SimpleNamespace

    from kernelagent.harness import EvalResult, Status, Timing
    from kernelagent.harness.caller.evaluator import Evaluator

    monkeypatch.setattr(ke, "collect", lambda *a, **k: {"kernels": [_k("ampere_sgemm_128x64_nn", 3e6)]})
    result = EvalResult(status=Status.CORRECT, correct=True, fingerprint={"cuda": True},
                        timings={"candidate": Timing(median_ms=1.0, q1_ms=1.0, q3_ms=1.0, min_ms=1.0, reps=5)})
    problem = SimpleNamespace(path=CANDIDATES / "relu_problem.py")
    fake_self = SimpleNamespace(visible_devices=None, cuda_cache_dir=tmp_path)
    Evaluator._kernel_evidence(fake_self, result, problem, TRITON, "triton")
    assert result.status == Status.REJECTED and not result.correct
    assert result.reason.startswith("[no-custom-kernel]") and result.stage == "evidence"
    assert result.kernel_evidence["kernels"][0]["name"] == "ampere_sgemm_128x64_nn"

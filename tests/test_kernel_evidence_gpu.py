"""Out-of-process kernel evidence on a real GPU (needs ncu and, for the sandbox, bubblewrap or
an explicit opt-in): `pytest -m gpu tests/test_kernel_evidence_gpu.py`."""

from __future__ import annotations

import shutil

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import CANDIDATES, TESTS, read

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_evaluator(cuda_evaluator):
    from kernelagent.harness.caller.profiling import find_ncu

    if find_ncu() is None:
        pytest.skip("needs Nsight Compute (ncu)")
    if shutil.which("bwrap") is None:
        pytest.skip("ncu runs candidates only inside bubblewrap: install or unpack it (see the device setup)")
    return cuda_evaluator


def test_honest_kernel_is_seen_by_ncu(gpu_evaluator):
    result = gpu_evaluator.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"),
                                    EvalConfig(trials=2, baselines=False, kernel_evidence=True))
    print("\nhonest:", result.status, result.kernel_evidence, [f.message for f in result.flags][:3])
    assert result.status == Status.CORRECT, result.reason
    names = [k["name"] for k in result.kernel_evidence.get("kernels", [])]
    assert any(n.startswith("relu_kernel") for n in names), result.kernel_evidence


def test_torch_work_behind_a_popped_dispatch_mode_is_rejected(gpu_evaluator):
    """h3_dispatch_mode_pop switches the in-process recorder off; ncu still sees clamp's kernel
    doing the work and the candidate's own kernel doing almost nothing."""
    result = gpu_evaluator.evaluate(CANDIDATES / "relu_problem.py",
                                    read(TESTS / "adversarial" / "h3_dispatch_mode_pop.py"),
                                    EvalConfig(trials=2, baselines=False, kernel_evidence=True,
                                               min_own_device_share=None))
    print("\npopped:", result.status, result.reason[:300])
    assert result.status == Status.REJECTED, result.reason
    assert result.reason.startswith(("[hidden-work]", "[no-custom-kernel]"))

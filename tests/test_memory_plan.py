"""The memory plan's estimate (child/memory_plan.py): a problem's bytes from the meta device,
before anything is allocated, and the `too_large` rule. Real KernelBench problems are used:
their 6 GiB inputs must be sized without allocating them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelagent.harness.child import memory_plan

KB = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "KernelBench"
GIB = 1 << 30


def _problem(relative: str):
    path = KB / relative
    if not path.exists():
        pytest.skip(f"KernelBench is not checked out beside the repository ({path})")
    return path.read_text()


def test_elementwise_problem_is_sized_without_allocating():
    sizes = memory_plan.estimate(_problem("level1/19_ReLU.py"))
    assert sizes == {"input_bytes": 6 * GIB, "output_bytes": 6 * GIB, "param_bytes": 0}
    # reference: 2 inputs + outputs; candidate: inputs + outputs; a margin each
    assert memory_plan.needed_bytes(sizes) == 5 * 6 * GIB + 2 * memory_plan.MARGIN_BYTES


def test_parameters_count():
    sizes = memory_plan.estimate(_problem("level3/2_ShallowWideMLP.py"))
    assert sizes is not None and sizes["param_bytes"] > 4 * GIB
    assert sizes["input_bytes"] < 64 << 20


def test_too_large_reason_gives_needed_and_free_bytes():
    sizes = {"input_bytes": 40 * GIB, "output_bytes": 40 * GIB, "param_bytes": 0}
    reason = memory_plan.too_large_reason(sizes, 79 * GIB)
    assert reason is not None
    assert "201.0 GiB" in reason and "79.0 GiB are free" in reason and "not the candidate's" in reason
    assert memory_plan.too_large_reason({"input_bytes": GIB, "output_bytes": GIB, "param_bytes": 0}, 79 * GIB) is None


def test_broken_problem_is_not_estimated(tmp_path):
    source = ("import torch\nclass Model(torch.nn.Module):\n    pass\n"
              "def get_inputs():\n    raise RuntimeError('no')\n"
              "def get_init_inputs():\n    return []\n")
    assert memory_plan.estimate(source) is None


def test_outputs_count_like_inputs_without_a_meta_kernel():
    source = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
              "        return torch.from_numpy(x.cpu().numpy())\n"
              "def get_inputs():\n    return [torch.rand(1024, 1024)]\n"
              "def get_init_inputs():\n    return []\n")
    assert memory_plan.estimate(source) == {"input_bytes": 4 << 20, "output_bytes": 4 << 20, "param_bytes": 0}


# Full-size KernelBench evaluations on an H200, each alone (scripts/device/memory_probe.py,
# 2026-11-28): the problem's bytes, and NVML's peak of used memory over the evaluation (both
# processes and their contexts), GiB. Reserving needed_bytes alone (5.5 GiB per 1 GiB of ReLU's
# inputs) let 10 of 25 of tests/test_kernelbench_solutions.py's jobs run out of memory beside
# each other.
H200_PEAKS = [
    # (problem, input GiB, output GiB, NVML peak GiB)
    ("level1/19_ReLU", 6.0, 6.0, 47.29),
    ("level1/23_Softmax", 6.0, 6.0, 59.11),
    ("level1/36_RMSNorm_", 7.0, 7.0, 58.80),
    ("level1/38_L1Norm_", 8.0, 8.0, 65.66),
    ("level1/45_Average_Pooling_2D", 16.0, 0.13, 117.99),
    ("level1/3_Batched_matrix_multiplication", 1.25, 0.5, 9.68),
]


@pytest.mark.parametrize("name, inputs, outputs, peak", H200_PEAKS, ids=[row[0] for row in H200_PEAKS])
def test_the_reservation_covers_what_an_h200_evaluation_held(name, inputs, outputs, peak):
    from kernelagent.harness.server.gate import job_memory_bytes

    free = 139.3 * GIB  # the H200's free memory before any job
    reserved = job_memory_bytes(int(inputs * GIB), int(outputs * GIB), 0, int(free))
    assert reserved >= peak * GIB, (name, reserved / GIB)
    # ...without taking the device from problems that fit it: too_large still asks needed_bytes
    sizes = {"input_bytes": int(inputs * GIB), "output_bytes": int(outputs * GIB), "param_bytes": 0}
    assert memory_plan.too_large_reason(sizes, int(free)) is None
    assert reserved <= 1.8 * peak * GIB, (name, reserved / GIB)  # and not far above it (ReLU: 1.7x)


def test_the_harness_bytes_stay_within_a_share_of_free_memory():
    assert memory_plan.harness_bytes(10 * GIB, 20 * GIB) == int(0.3 * 20 * GIB)
    assert memory_plan.harness_bytes(10 * GIB, None) == 15 * GIB
    assert memory_plan.harness_bytes(1 << 20, 80 * GIB) == memory_plan.HARNESS_FLOOR

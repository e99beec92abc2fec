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

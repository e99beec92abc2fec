"""The static pass: findings with line numbers on exploits, none on known-good code."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelagent.harness.caller.static_check import check_source, summary
from tests.conftest import BENCHMARKS, CANDIDATES

ADV = Path(__file__).resolve().parent / "adversarial"
GOOD = sorted((BENCHMARKS / "solutions").glob("level*/*.py")) + [CANDIDATES / "relu_good.py",
                                                                   ADV / "honest_glue.py"]


@pytest.mark.parametrize("path", GOOD, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_findings_on_known_good_code(path):
    rejects = [f for f in check_source(path.read_text()) if f.severity == "reject"]
    assert not rejects, [f.message_with_line() for f in rejects]


@pytest.mark.parametrize("source, kind, line", [
    ("import torch\nclass ModelNew:\n    def forward(self, a, b):\n        return torch.matmul(a, b)\n",
     "no-custom-kernel", 4),
    ("import torch.nn.functional as F\nclass ModelNew:\n    def forward(self, x):\n        return F.softmax(x, -1)\n",
     "no-custom-kernel", 4),
    ("class ModelNew:\n    def forward(self, a, b):\n        return a @ b\n", "no-custom-kernel", 3),
    ("class ModelNew:\n    def forward(self, x):\n        return x.softmax(-1)\n", "no-custom-kernel", 3),
    ("import torch\nclass ModelNew:\n    def forward(self, x):\n        try:\n            k[(1,)](x)\n"
     "        except Exception:\n            return torch.relu(x)\n", "fallback-to-reference", 4),
    ("import torch\ns = torch.cuda.Stream()\nclass ModelNew: pass\n", "hidden-work", 2),
    ("import threading\nclass ModelNew: pass\n", "hidden-work", 1),
    ("import time\ntime.perf_counter = lambda: 0.0\nclass ModelNew: pass\n", "tampering", 2),
    ("import torch\nsetattr(torch, 'allclose', None)\nclass ModelNew: pass\n", "tampering", 2),
    ("import kernelagent.harness.child.timing as t\nclass ModelNew: pass\n", "tampering", 1),
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\nclass ModelNew: pass\n", "numeric-modes", 2),
    ("import torch\ntorch.set_float32_matmul_precision('medium')\nclass ModelNew: pass\n", "numeric-modes", 2),
    ("import gc\nclass ModelNew: pass\n", "reading-reference", 1),
    ("import sys\nf = sys._getframe(1).f_back\nclass ModelNew: pass\n", "reading-reference", 2),
    ("from problem import Model\nclass ModelNew(Model): pass\n", "reading-reference", 1),
    ("import socket\nclass ModelNew: pass\n", "sandbox-escape", 1),
])
def test_exploit_patterns_are_found_with_line_numbers(source, kind, line):
    findings = [f for f in check_source(source) if f.severity == "reject"]
    assert any(f.kind == kind and f.line == line for f in findings), [(f.kind, f.line) for f in findings]
    assert f"candidate.py:{line}" in summary(findings)


def test_triton_code_and_main_guard_are_not_flagged():
    source = (
        "import torch\nimport triton\nimport triton.language as tl\n\n"
        "@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n    x = tl.load(x_ptr + tl.arange(0, BLOCK))\n"
        "    s = tl.sum(x, axis=0)\n    y = x.to(tl.float32)\n    d = tl.dot(x, x)\n\n"
        "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.reshape(-1).contiguous()\n\n"
        "if __name__ == '__main__':\n    print(torch.matmul(torch.ones(2, 2), torch.ones(2, 2)))\n"
    )
    assert [f for f in check_source(source) if f.severity == "reject"] == []


def test_syntax_error_gives_no_findings():
    assert check_source("def broken(:\n") == []

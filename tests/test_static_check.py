"""The static pass: findings with line numbers on exploits, none on known-good code."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelagent.harness.caller.static_check import check_source, summary
from tests.conftest import BENCHMARKS, CANDIDATES

ADV = Path(__file__).resolve().parent / "adversarial"
CUDA_CANDIDATES = Path(__file__).resolve().parent / "cuda_candidates"
# The corpus of known-good code, with the backend each file is evaluated under: our Triton
# solutions, our CUDA solutions, the KernelBench solutions and the honest test candidates.
GOOD = ([(p, "triton") for p in sorted((BENCHMARKS / "solutions").glob("level*/*.py"))]
        + [(p, "cuda") for p in sorted((BENCHMARKS / "solutions_cuda").glob("level*/*.py"))]
        + [(p, "triton") for p in sorted((BENCHMARKS / "kernelbench_solutions").glob("level*/*.py"))]
        + [(CANDIDATES / "relu_good.py", "triton"), (ADV / "honest_glue.py", "triton"),
           (CUDA_CANDIDATES / "relu_ok.py", "cuda"), (CUDA_CANDIDATES / "relu_named_relu_error.py", "cuda")])


def test_the_corpus_is_all_there():
    # A glob that silently matched nothing would make the corpus test pass vacuously.
    by_dir = {p.parents[1].name for p, _ in GOOD}
    assert {"solutions", "solutions_cuda", "kernelbench_solutions"} <= by_dir
    assert sum(1 for p, _ in GOOD if p.parents[1].name == "kernelbench_solutions") >= 30


@pytest.mark.parametrize("path, backend", GOOD, ids=lambda v: f"{v.parents[1].name}/{v.parent.name}/{v.stem}"
                         if isinstance(v, Path) else v)
def test_no_findings_on_known_good_code(path, backend):
    rejects = [f for f in check_source(path.read_text(), backend=backend) if f.severity == "reject"]
    assert not rejects, [f.message_with_line() for f in rejects]


_BUILD = "from torch.utils.cpp_extension import load_inline\n"


@pytest.mark.parametrize("source", [
    # a module-level extension whose function is called like a tensor method
    _BUILD + "_ext = load_inline(name='a', cpp_sources='', functions=['relu'])\n"
             "class ModelNew:\n    def forward(self, x):\n        return _ext.relu(x)\n",
    # an attribute bound in __init__
    _BUILD + "class ModelNew:\n    def __init__(self):\n        self.ext = load_inline(name='a', cpp_sources='')\n"
             "    def forward(self, x):\n        return self.ext.softmax(x, 1)\n",
    # a cached builder function, its result in a local and called directly
    "import functools\nimport torch.utils.cpp_extension as ce\n@functools.lru_cache(None)\ndef _get():\n"
    "    return ce.load_inline(name='a', cpp_sources='')\nclass ModelNew:\n    def forward(self, x):\n"
    "        e = _get()\n        return e.relu(x) + _get().gelu(x)\n",
    # a parameter that receives the extension at every call site, or by default
    _BUILD + "_ext = load_inline(name='a', cpp_sources='')\ndef run(ext, x):\n    return ext.relu(x)\n"
             "def run2(x, ext=_ext):\n    return ext.tanh(x)\n"
             "class ModelNew:\n    def forward(self, x):\n        return run2(run(_ext, x))\n",
    # an imported (prebuilt) module, a method of the candidate's own class, a custom op namespace
    "import torch\nimport my_ext\nclass ModelNew:\n    def relu(self, x):\n        return my_ext.relu(x)\n"
    "    def forward(self, x):\n        return torch.ops.my_ns.gelu(self.relu(x))\n",
], ids=["module-ext", "self-attr-ext", "builder", "parameters", "module-method-customop"])
def test_resolved_receivers_are_not_tensors(source):
    rejects = [f for f in check_source(source, backend="cuda") if f.severity == "reject"]
    assert not rejects, [f.message_with_line() for f in rejects]


@pytest.mark.parametrize("source, line", [
    ("class ModelNew:\n    def forward(self, x):\n        return x.relu()\n", 3),
    # the parameter gets a tensor at one call site: it may be a tensor
    (_BUILD + "_ext = load_inline(name='a', cpp_sources='')\ndef run(ext, x):\n    return ext.relu(x)\n"
              "class ModelNew:\n    def forward(self, x):\n        return run(_ext, run(x, x))\n", 4),
    # a PyTorch module bound to self (not a method of the class)
    ("import torch\nclass ModelNew:\n    def __init__(self):\n        self.relu = torch.nn.ReLU()\n"
     "    def forward(self, x):\n        return self.relu(x)\n", 6),
    ("import torch\nclass ModelNew:\n    def forward(self, x):\n        return torch.ops.aten.relu(x)\n", 4),
    # json.load is not an extension build
    ("import json\n_ext = json.load(open('x'))\nclass ModelNew:\n    def forward(self, x):\n"
     "        return _ext.relu(x)\n", 5),
    ("import torch\nclass ModelNew:\n    def forward(self, x):\n        return torch.empty_like(x).softmax(1)\n", 4),
], ids=["tensor-param", "mixed-param", "self-torch-module", "aten-op", "json-load", "call-result"])
def test_unresolved_receivers_are_still_judged(source, line):
    findings = [f for f in check_source(source, backend="cuda") if f.severity == "reject"]
    assert any(f.kind == "no-custom-kernel" and f.line == line for f in findings), \
        [(f.kind, f.line) for f in findings]


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
    # issue 24, class 1: PyTorch below the dispatcher, NumPy on a tensor's memory
    ("import torch\nclass ModelNew:\n    def forward(self, x):\n        ks = torch._C._dispatch_keyset_full()\n"
     "        return torch.ops.aten._softmax.default.redispatch(ks, x, -1, False)\n", "no-custom-kernel", 4),
    ("import numpy as np\nclass ModelNew:\n    def forward(self, x):\n        a = x.numpy()\n"
     "        np.maximum(a, 0, out=a)\n        return x\n", "no-custom-kernel", 4),
    ("import numpy as np\nclass ModelNew:\n    def forward(self, x):\n        a = np.asarray(x.__array__())\n"
     "        return x\n", "no-custom-kernel", 4),
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


def test_cuda_extension_function_named_relu_is_not_a_tensors_relu():
    """`_ext.relu(x)` used to be rejected as a tensor's .relu(); the static pass now lets it
    through (tests/test_cuda_backend.py's relu_typo build shows it reaching the compiler, whose
    error is reported)."""
    source = (CUDA_CANDIDATES / "relu_named_relu_error.py").read_text()
    assert not [f for f in check_source(source, backend="cuda") if f.severity == "reject"]
    torch_relu = source.replace("return _ext.relu(x)", "return x.relu()")
    assert [f for f in check_source(torch_relu, backend="cuda") if f.severity == "reject"]

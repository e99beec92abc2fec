"""Kernels inlined into one spliced model (wholemodel/inline.py, issue 43): two kernels that define
the same names, and a model that binds one of a kernel's import names to something else, live in
one module and each still reaches its own. Plain Python, no torch: the renaming is what is tested
(tests/test_wholemodel_cli.py runs real spliced models)."""

from __future__ import annotations

import ast

import pytest

from kernelagent.wholemodel.inline import InlineError, bindings, inline

MODEL = '''
import math as m
F = 3                      # the model's own F: a kernel's `functional as F` must not replace it

class Model:
    def forward(self, x):
        return x + F
'''
KERNEL_A = '''
import math as m
from functools import reduce as F
SCALE = 2

def _k(x, SCALE=SCALE):
    return [v * SCALE for v in x]

class ModelNew:
    SCALE = 100            # a class attribute keeps its name
    def forward(self, x):
        total = F(lambda a, b: a + b, _k(x))
        return total + m.floor(0.5) + self.SCALE
'''
KERNEL_B = '''
SCALE = 10

def _k(x):
    SCALE = 1              # a local shadows the module's name
    return [v + SCALE for v in x]

def _twice(x):
    global SCALE
    SCALE = SCALE * 2
    return _k(x)

class ModelNew:
    def forward(self, x):
        return sum(_twice(x)) + SCALE
'''


def assemble() -> dict:
    taken = bindings(ast.parse(MODEL))
    a = inline(KERNEL_A, "_region_0_", taken=taken)
    b = inline(KERNEL_B, "_region_1_", taken=taken)
    namespace: dict = {}
    exec(compile("\n".join([MODEL, a.code, b.code]), "<spliced>", "exec"), namespace)  # noqa: S102 - the test's own code
    return namespace


def test_two_kernels_and_the_model_share_one_module_and_each_reaches_its_own():
    ns = assemble()
    assert ns["Model"]().forward(1) == 4  # the model's F is still 3
    assert ns["_region_0_ModelNew"]().forward([1, 2]) == 6 + 0 + 100
    assert ns["_region_1_ModelNew"]().forward([1, 2]) == 5 + 20  # its own SCALE, doubled through `global`
    assert ns["_region_0_SCALE"] == 2 and ns["_region_1_SCALE"] == 20
    assert "ModelNew" not in ns and "_k" not in ns


def test_imports_the_file_already_binds_the_same_way_keep_their_names():
    taken = bindings(ast.parse(MODEL))
    done = inline(KERNEL_A, "_p_", taken=taken)
    assert "import math as m" in done.code  # the same binding as the model's: Triton's `tl` stays `tl`
    assert "reduce as _p_F" in done.code  # the model binds F otherwise


def test_what_cannot_be_renamed_safely_is_refused():
    with pytest.raises(InlineError, match="import \\*"):
        inline("from math import *\n", "_p_")
    with pytest.raises(InlineError, match="globals"):
        inline("X = 1\ndef f():\n    return globals()['X']\n", "_p_")


def test_future_imports_are_returned_apart():
    done = inline("from __future__ import annotations\nX = 1\n", "_p_")
    assert done.futures == ["from __future__ import annotations"] and "__future__" not in done.code

"""The reference's process makes its CUDA context with one hardware connection
(KERNELAGENT_REFERENCE_CONNECTIONS; server/processes.py reference_connections): the driver makes
and frees contexts under one lock for the whole host, in about half the time with one. The
candidate's process keeps the caller's setting. Measured: benchmarks/README.md, run K."""

from __future__ import annotations

import os

import pytest

from kernelagent.harness import EvalConfig, Evaluator, Status
from kernelagent.harness.config import StageTimeouts
from kernelagent.harness.server.processes import reference_connections
from kernelagent.settings import SettingError

# The problem's model multiplies by what its process sees of CUDA_DEVICE_MAX_CONNECTIONS (8,
# CUDA's default, where unset); so does the candidate's kernel, in the candidate's process. They
# agree exactly when both processes see the same value.
PROBLEM = '''import os
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * float(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8"))


def get_inputs():
    return [torch.rand(4096)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''import os
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, k, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * k, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        k = float(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8"))
        scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), k, BLOCK=1024)
        return y
'''


@pytest.mark.parametrize(("setting", "expected"), [(None, "1"), ("1", "1"), ("4", "4")])
def test_the_reference_connections_are_set(setting, expected):
    environ = {} if setting is None else {"KERNELAGENT_REFERENCE_CONNECTIONS": setting}
    assert reference_connections(environ) == int(expected)
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == expected


def test_zero_leaves_cuda_default_or_the_callers_own():
    assert reference_connections({"KERNELAGENT_REFERENCE_CONNECTIONS": "0"}) is None
    mine = {"KERNELAGENT_REFERENCE_CONNECTIONS": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "2"}
    assert reference_connections(mine) is None and mine["CUDA_DEVICE_MAX_CONNECTIONS"] == "2"


@pytest.mark.parametrize("bad", ["-1", "one", "1.5"])
def test_a_malformed_setting_is_refused(bad):
    with pytest.raises(SettingError):
        reference_connections({"KERNELAGENT_REFERENCE_CONNECTIONS": bad})


# setting -> (what the reference's process sees, the verdict): the candidate's process sees 8
# (CUDA_DEVICE_MAX_CONNECTIONS unset) in every row.
ROWS = [(None, Status.INCORRECT, 1), ("3", Status.INCORRECT, 3), ("0", Status.CORRECT, "default")]


@pytest.mark.parametrize(("setting", "status", "recorded"), ROWS, ids=["default", "three", "off"])
def test_only_the_reference_process_gets_the_setting(tmp_path, monkeypatch, setting, status, recorded):
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    if setting is None:
        monkeypatch.delenv("KERNELAGENT_REFERENCE_CONNECTIONS", raising=False)
    else:
        monkeypatch.setenv("KERNELAGENT_REFERENCE_CONNECTIONS", setting)
    problem = tmp_path / "scale.py"
    problem.write_text(PROBLEM)
    config = EvalConfig(trials=1, timing=False, derived_checks=0, static_check="off", kernel_evidence=False,
                        timeouts=StageTimeouts(start=60, load=60, compile=90, correctness=90, timing=60))
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache") as ev:
        result = ev.evaluate(problem, CANDIDATE, config)
    assert result.status == status, result.feedback() + "\n" + result.log
    assert result.concurrency["reference_connections"] == recorded
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ  # the caller's own is untouched

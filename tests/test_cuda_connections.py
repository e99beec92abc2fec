"""CUDA_DEVICE_MAX_CONNECTIONS in a job's two processes (server/processes.py): the driver makes
and frees contexts under one lock for the whole host, in about half the time with one connection
(benchmarks/README.md, runs J and K). The reference's process gets one by default
(KERNELAGENT_REFERENCE_CONNECTIONS); the candidate's keeps the caller's unless
KERNELAGENT_CANDIDATE_CONNECTIONS asks, and never where its source names a stream or a graph."""

from __future__ import annotations

import os
import random
from types import SimpleNamespace

import pytest

from kernelagent.harness import EvalConfig, Evaluator, Status
from kernelagent.harness.config import StageTimeouts
from kernelagent.devices import first_visible_device
from kernelagent.harness.server.ncu import session_visible_devices
from kernelagent.harness.server.processes import candidate_connections, child_cuda_environ, reference_connections
from kernelagent.harness.server.start import Start
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
    # the server hands the value to the reference's process, which sets it before CUDA's start
    child_cuda_environ({"reference_connections": reference_connections(environ)}, candidate=False, environ=environ)
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == expected


def test_zero_leaves_cuda_default_or_the_callers_own():
    assert reference_connections({"KERNELAGENT_REFERENCE_CONNECTIONS": "0"}) is None
    mine = {"KERNELAGENT_REFERENCE_CONNECTIONS": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "2"}
    child_cuda_environ({"reference_connections": reference_connections(mine)}, candidate=False, environ=mine)
    assert reference_connections(mine) is None and mine["CUDA_DEVICE_MAX_CONNECTIONS"] == "2"


@pytest.mark.parametrize("bad", ["-1", "one", "1.5"])
def test_a_malformed_setting_is_refused(bad):
    with pytest.raises(SettingError):
        reference_connections({"KERNELAGENT_REFERENCE_CONNECTIONS": bad})


STREAMED = CANDIDATE + "\n# the current stream only\n"
NAMES = "default (the source names a stream or a graph)"


@pytest.mark.parametrize(("setting", "source", "expected"), [
    (None, CANDIDATE, (None, "default")),
    ("0", CANDIDATE, (None, "default")),
    ("1", CANDIDATE, (1, "1")),
    ("2", CANDIDATE, (2, "2")),
    ("1", STREAMED, (None, NAMES)),
    ("1", CANDIDATE.replace("ModelNew", "ModelNew  # replays a CUDA Graph"), (None, NAMES)),
    ("1", "s = torch.cuda.STREAM()", (None, NAMES)),
])
def test_the_candidates_connections(setting, source, expected):
    environ = {} if setting is None else {"KERNELAGENT_CANDIDATE_CONNECTIONS": setting}
    assert candidate_connections(source, environ) == expected


# (the reference's setting, the candidate's, its source) -> the verdict and what the result records:
# each process multiplies by what it sees (8 where unset), so they agree only where both see the same.
ROWS = [
    ((None, None, CANDIDATE), Status.INCORRECT, 1, "default"),    # 1 against 8
    (("3", None, CANDIDATE), Status.INCORRECT, 3, "default"),     # 3 against 8
    (("0", None, CANDIDATE), Status.CORRECT, "default", "default"),  # 8 and 8
    ((None, "1", CANDIDATE), Status.CORRECT, 1, "1"),             # 1 and 1
    ((None, "1", STREAMED), Status.INCORRECT, 1, NAMES),          # 1 against 8: its streams kept
]


@pytest.mark.parametrize(("settings_", "status", "reference", "candidate"), ROWS,
                         ids=["default", "reference-three", "reference-off", "candidate-one", "candidate-streams"])
def test_each_process_gets_its_own_setting(tmp_path, monkeypatch, settings_, status, reference, candidate):
    ref_setting, cand_setting, source = settings_
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    for name, value in (("KERNELAGENT_REFERENCE_CONNECTIONS", ref_setting),
                        ("KERNELAGENT_CANDIDATE_CONNECTIONS", cand_setting)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    problem = tmp_path / "scale.py"
    problem.write_text(PROBLEM)
    config = EvalConfig(trials=1, timing=False, derived_checks=0, static_check="off", kernel_evidence=False,
                        timeouts=StageTimeouts(start=60, load=60, compile=90, correctness=90, timing=60))
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache") as ev:
        result = ev.evaluate(problem, source, config)
    assert result.status == status, result.feedback() + "\n" + result.log
    assert result.concurrency["reference_connections"] == reference
    assert result.concurrency["candidate_connections"] == candidate
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ  # the caller's own is untouched


# -- the one GPU a job's processes see ------------------------------------------------------------
@pytest.mark.parametrize(("visible", "expected"), [
    (None, "0"),               # unset: CUDA's first device, named
    ("0", None),               # one already
    ("3", None),
    ("2,3", "2"),              # CUDA's cuda:0 is the list's first entry
    (" 1 , 0 ", "1"),
    ("GPU-aaa,GPU-bbb", "GPU-aaa"),
    ("MIG-x", None),
    ("", None),                # no GPU: nothing to narrow
    ("-1,0", None),
])
def test_the_first_visible_device(visible, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert first_visible_device(environ) == expected


@pytest.mark.parametrize(("device", "visible", "expected"), [
    ("cuda:2", "0,1,2", "2"),  # the caller's physical index, as before
    ("cuda", None, "0"),       # a server's session: the server's first GPU, as its jobs
    ("cuda", "4,5", "4"),
    ("cuda", "5", None),
    ("cpu", None, None),
])
def test_an_evidence_session_sees_the_device_it_profiles(device, visible, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert session_visible_devices(device, environ) == expected


@pytest.mark.parametrize(("job", "candidate", "expected"), [
    ({"cuda_visible": "2", "cuda_connections": 1, "reference_connections": 3}, True,
     {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    ({"cuda_visible": "2", "cuda_connections": 1, "reference_connections": 3}, False,  # its own, not the candidate's
     {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_MAX_CONNECTIONS": "3"}),
    ({"cuda_visible": "2"}, True, {"CUDA_VISIBLE_DEVICES": "2"}),
    ({"reference_connections": 1}, False, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    ({"cuda_connections": 4}, False, {}),               # the candidate's is not the reference's
    ({"reference_connections": 4}, True, {}),           # nor the other way
])
def test_each_childs_cuda_environment(job, candidate, expected):
    environ = {"KERNELAGENT_REFERENCE_CONNECTIONS": "1"}
    child_cuda_environ(job, candidate=candidate, environ=environ)
    assert environ == {"KERNELAGENT_REFERENCE_CONNECTIONS": "1", **expected}


def _start_for(fingerprint: dict, source: str = CANDIDATE) -> Start:
    job = SimpleNamespace(job_id="j", request={"config": {}, "candidate_source": source}, smoke=False,
                          problem_source=PROBLEM, fingerprint=fingerprint, rng=random.Random(0), baselines_only=False,
                          concurrency={}, config=EvalConfig())
    return Start(job)


@pytest.mark.parametrize(("visible", "expected"), [(None, "0"), ("1,0", "1"), ("1", None)])
def test_a_gpu_jobs_processes_are_given_the_servers_first_gpu(monkeypatch, visible, expected):
    monkeypatch.delenv("KERNELAGENT_REFERENCE_CONNECTIONS", raising=False)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    start = _start_for({"cuda": True, "free_bytes": 1 << 30})
    child_job = start.child_job()
    assert child_job.get("cuda_visible") == expected
    assert start.job.concurrency["job_visible_devices"] == (expected or visible)
    # the reference's connections are chosen here too (the default, 1), and said in the result
    assert child_job["reference_connections"] == 1 and start.job.concurrency["reference_connections"] == 1
    cpu = _start_for({"cuda": False})
    assert "cuda_visible" not in cpu.child_job() and "job_visible_devices" not in cpu.job.concurrency

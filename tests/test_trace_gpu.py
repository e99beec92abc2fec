"""The kernel trace in a real evaluation (issue 55), on the GPU: `pytest -m gpu tests/test_trace_gpu.py`.

An honest Triton ReLU through a server of its own whose jobs' raw traces are written out
(KERNELAGENT_TRACE_DUMP): the server built the tracer, and the candidate's trace holds its hello
first and its final flush last, a gap-free seq, nothing dropped, and one marker pair for the
first call, each check the server ordered, each warm-up and each timed call, with the
candidate's own kernel inside every timed call's span. The trace's rules judge such traces
(trace/rules.py); this test holds the tracer and the harness's markers to the contract they judge."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kernelagent.harness import EvalConfig, Status
from tests.conftest import CANDIDATES, read

pytestmark = pytest.mark.gpu

MARKER = "kernelagent_trace_marker"


@pytest.fixture(scope="module")
def traced(tmp_path_factory, cache_dir):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kernelagent.harness import Evaluator

    dump = tmp_path_factory.mktemp("traces")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELAGENT_TRACE_DUMP", str(dump))
        with Evaluator(device="cuda", cache_dir=cache_dir) as ev:
            result = ev.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"),
                                 EvalConfig(trials=2, baselines=False, kernel_evidence=False))
    files = sorted(dump.glob("*.jsonl"))
    return result, files


def test_the_server_built_the_tracer_and_read_a_whole_trace(traced):
    result, files = traced
    assert result.status == Status.CORRECT, result.feedback()
    assert "library" in result.fingerprint.get("trace", {}), result.fingerprint.get("trace")
    assert result.trace and result.trace["bytes"] > 0 and not result.trace["overflow"], result.trace
    assert len(files) == 1


def test_the_trace_holds_every_call_between_its_markers(traced):
    result, files = traced
    records = [json.loads(line) for line in files[0].read_bytes().splitlines()]
    assert records[0]["t"] == "hello" and records[-1]["t"] == "flush" and records[-1]["final"] == 1
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert not [r for r in records if r["t"] == "dropped"]
    kernels = [r for r in records if r["t"] == "kernel"]
    assert all(0 < k["start"] <= k["end"] for k in kernels)
    markers = [k for k in kernels if k["name"] == MARKER]
    pairs = Counter((m["grid"][1], m["grid"][0] - 1, m["grid"][2]) for m in markers)
    assert set(pairs.values()) == {1}  # no marker twice
    by_phase = Counter(phase for phase, _i, end in pairs if end == 2)
    assert by_phase[1] == 1 and by_phase[2] >= 2  # the first call; the checks (main, signed, post...)
    assert by_phase[4] == result.timed_loop["warmup_calls"] and by_phase[3] == result.timed_loop["calls"]
    assert all((p, i, 1) in pairs for p, i, end in pairs if end == 2)
    begin = {(m["grid"][1], m["grid"][0] - 1): m for m in markers if m["grid"][2] == 1}
    for m in markers:
        if m["grid"][2] != 2 or m["grid"][1] != 3:
            continue
        b = begin[(3, m["grid"][0] - 1)]
        inside = [k for k in kernels if k["name"] != MARKER and b["end"] <= k["start"] and k["end"] <= m["start"]]
        assert any("relu" in k["name"] for k in inside), (m["grid"], [k["name"] for k in inside])
    assert len({m["stream"] for m in markers}) == 1 and len({k["ctx"] for k in kernels}) == 1

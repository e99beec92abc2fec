"""Two clocks per result (issue 58, docs/concepts/timing.md "Two clocks"): the candidate's device
time per call (its kernel trace) beside its wall time per call and the host share between them
(result.CallClock, caller/clocks.apply_clocks), the speedups on the device clock where the
baselines' device times were traced too, and what `kernelagent eval` prints and writes of them.
The trace figures come over a pipe: each is validated before it is a figure."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from kernelagent.cli.render import render_result
from kernelagent.harness.caller.clocks import apply_clocks
from kernelagent.harness.caller.results import apply_kernel_evidence
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import CallClock, EvalResult, Flag, Status, Timing
from tests import tracefake
from tests.test_evidence_stage import CALLS, CHECKS, OWN, SEGMENTS, SOURCE, WARMUPS, _job, ncu_runs  # noqa: F401
from kernelagent.harness.server import evidence


def _timing(ms: float, **kw) -> Timing:
    return Timing(median_ms=ms, q1_ms=ms, q3_ms=ms, min_ms=ms, reps=5, samples_ms=[ms] * 5, **kw)


def _result(wall_ms: float = 0.05, device_ms=None, baselines: dict | None = None) -> EvalResult:
    result = EvalResult(status=Status.CORRECT, compiled=True, correct=True, fingerprint={"cuda": True})
    result.timings["candidate"] = _timing(wall_ms)
    for name, (wall, device) in (baselines or {}).items():
        result.timings[name] = _timing(wall, device_ms=device)
    if device_ms is not None:
        result.kernel_evidence["trace_ms_per_call"] = device_ms
    return result


# device_ms, wall_ms -> host share (None: no figure at all)
CLOCK_ROWS = [
    (0.04, 0.05, 0.2),            # 10 us of the 50 us wall time the device ran nothing of the call
    (0.05, 0.05, 0.0),
    (0.06, 0.05, 0.0),            # kernels overlapping each other sum past the wall: clamped to 0
    (0.0, 0.05, 1.0),             # no kernel time at all: all host
    (float("nan"), 0.05, None),
    (float("inf"), 0.05, None),
    (-0.01, 0.05, None),
    (True, 0.05, None),           # a boolean is not a time
    ("0.04", 0.05, None),         # nor a string
    (0.04, 0.0, None),            # a wall time of zero divides nothing
    (0.04, float("nan"), None),
]


@pytest.mark.parametrize("device,wall,share", CLOCK_ROWS)
def test_the_call_clock_is_validated_and_its_host_share_clamped(device, wall, share):
    clock = CallClock.of(device_ms=device, wall_ms=wall)
    if share is None:
        assert clock is None
    else:
        assert clock is not None and clock.host_share == pytest.approx(share)
        assert 0.0 <= clock.host_share <= 1.0 and clock.device_ms == pytest.approx(float(device))


def test_an_honest_traced_result_states_both_figures(ncu_runs):
    job = _job(tracefake.process(tracefake.one(OWN, 40), checks=CHECKS, warmups=WARMUPS, segments=SEGMENTS,
                                 calls=CALLS).to_bytes(), config=EvalConfig(audit_share=0.0))
    evidence.stage(job)
    result = _result(wall_ms=0.05)
    apply_kernel_evidence(result, job.facts.evidence, SOURCE)
    assert result.status == Status.CORRECT
    clock = result.per_call
    assert clock is not None and clock.source == "trace"
    assert clock.device_ms == pytest.approx(0.04, rel=0.01) and clock.wall_ms == 0.05
    assert clock.host_share == pytest.approx(0.2, abs=0.01)


def test_without_a_trace_there_is_no_device_figure():
    result = _result(wall_ms=0.05)
    apply_kernel_evidence(result, {"kernels": [{"name": OWN, "launches": 2, "total_ns": 100_000}]}, SOURCE)
    assert result.per_call is None and result.speedups_device == {}
    cpu = _result(wall_ms=0.05, device_ms=0.04)
    cpu.timings["candidate"].meaningful = False
    apply_clocks(cpu)
    assert cpu.per_call is None


def test_an_incomplete_trace_gives_no_device_figure():
    result = _result(wall_ms=0.05)
    apply_kernel_evidence(result, {"trace": {"flags": [], "incomplete": "dropped 3 records",
                                             "facts": {"kernel_ms_per_call": 0.01}},
                                   "kernels": [{"name": OWN, "launches": 2, "total_ns": 100_000}]}, SOURCE)
    assert result.per_call is None and "trace_ms_per_call" not in result.kernel_evidence


# a baseline's device ms per call -> its device speedup over a candidate of 0.04 ms (None: absent)
DEVICE_SPEEDUP_ROWS = [
    (0.08, 2.0),
    (0.02, 0.5),
    (None, None),                 # the baseline was not traced
    (0.0, None),                  # not a time to divide
    (-0.08, None),
    (float("nan"), None),
    (float("inf"), None),
    ("0.08", None),
]


@pytest.mark.parametrize("base_device,speedup", DEVICE_SPEEDUP_ROWS)
def test_device_speedups_use_the_device_clock_on_both_sides(base_device, speedup):
    result = _result(wall_ms=0.05, device_ms=0.04, baselines={"eager": (0.1, None)})
    result.timings["eager"].device_ms = base_device
    apply_clocks(result)
    if speedup is None:
        assert "eager" not in result.speedups_device
    else:
        assert result.speedups_device["eager"] == pytest.approx(speedup)
    assert result.speedup_clock == "wall"


def test_no_device_speedup_for_an_impossible_time():
    result = _result(wall_ms=0.05, device_ms=0.04, baselines={"eager": (0.1, 0.08)})
    result.flags.append(Flag("impossible-speed", "faster than the memory allows", "review"))
    apply_clocks(result)
    assert result.per_call is not None and result.speedups_device == {}


# a cached or decoded baseline's device_ms -> what Timing.from_dict keeps
TIMING_ROWS = [(0.08, 0.08), (0, None), (-1.0, None), (float("nan"), None), ("0.1", None), (True, None), (None, None)]


@pytest.mark.parametrize("raw,kept", TIMING_ROWS)
def test_a_baseline_device_time_is_validated_on_read(raw, kept):
    data = {**_timing(0.1).__dict__, "device_ms": raw}
    assert Timing.from_dict(data).device_ms == kept


def test_the_json_carries_both_figures_and_its_clock():
    result = _result(wall_ms=0.05, device_ms=0.04, baselines={"eager": (0.1, 0.08)})
    apply_clocks(result)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["per_call"] == {"device_ms": 0.04, "wall_ms": 0.05, "host_share": pytest.approx(0.2),
                                "source": "trace"}
    assert data["speedups_device"] == {"eager": pytest.approx(2.0)} and data["speedup_clock"] == "wall"
    data["per_call"]["host_share"] = 0.0  # a stored share is not believed: it is recomputed
    data["speedups_device"]["compile"] = float("nan")
    back = EvalResult.from_dict(data)
    assert back.per_call == result.per_call and set(back.speedups_device) == {"eager"}
    data["per_call"] = {"device_ms": "x", "wall_ms": 0.05}
    data["speedups_device"] = [2.0]
    back = EvalResult.from_dict(data)
    assert back.per_call is None and back.speedups_device == {}


def test_eval_prints_both_figures_and_the_host_share():
    result = _result(wall_ms=0.05, device_ms=0.04, baselines={"eager": (0.1, 0.08)})
    result.speedups["eager"] = 2.0
    apply_clocks(result)
    out = io.StringIO()
    render_result(result, Console(file=out, width=200, force_terminal=False))
    text = out.getvalue()
    assert "device 0.0400 ms (trace), wall 0.0500 ms, host share 20%" in text, text
    assert "speedup vs eager (device)" in text and "2.000x" in text
    assert "speedup clock" in text and "wall" in text
    assert not math.isnan(result.per_call.host_share)

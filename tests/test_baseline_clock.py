"""The baselines on the device clock (issue 58): the reference process's own kernel trace, its
baselines' timed calls between markers of their own phases (trace/marks.py BASELINE + r), read
by the server after the baselines (server/trace_stage.baseline_clock, trace/baseline_clock.py)
into each baseline's `device_ms`, cached with it and validated on every read. The reference is
ours, yet what is decoded is validated: a trace that is not whole gives no figure, never a wrong
one."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from kernelagent.harness.caller.baseline_cache import BaselineCache
from kernelagent.harness.child import timing
from kernelagent.harness.server import trace_stage
from kernelagent.harness.trace import baseline_clock, channel, marks
from tests import tracefake
from tests.tracefake import MARKER, US, TraceFake

MODES = ["default", "max-autotune"]  # runners: eager, compile, compile:max-autotune
NAMES = marks.runner_names(MODES)


def _runner_calls(fake: TraceFake, runner: int, calls: int, kernels_us: list[float]) -> None:
    """One baseline runner's timed loop as child/timing.Timer.measure queues it: its warm-up
    unmarked, then each timed call between markers of phase BASELINE + runner."""
    for _ in range(2):
        for us in kernels_us:
            fake.kernel(f"warm_kernel_{runner}", int(us * US))
    for index in range(calls):
        fake.kernel(tracefake.FILL, 20 * US)  # the L2 flush
        fake.kernel(tracefake.SPIN, 400 * US)  # the launch cover
        fake.kernel(MARKER, 2 * US, grid=(index + 1, marks.BASELINE + runner, 1), block=(1, 1, 1))
        for k, us in enumerate(kernels_us):
            fake.kernel(f"runner_{runner}_kernel_{k}", int(us * US), gap=3 * US)
        fake.kernel(MARKER, 2 * US, grid=(index + 1, marks.BASELINE + runner, 2), block=(1, 1, 1))
    fake.kernel("empty_call_kernel", 2 * US)  # the runner's empty call, timed unmarked


def _reference(*, runners: dict[int, list[float]] | None = None, calls: int = 5, after: bool = True,
               edit=None) -> bytes:
    fake = TraceFake()
    fake.hello()
    fake.kernel(tracefake.NORMAL, 4 * US)  # the reference's checks and its calibration, unmarked
    for runner, kernels_us in (runners or {0: [30.0], 1: [10.0, 5.0], 2: [12.0]}).items():
        _runner_calls(fake, runner, calls, kernels_us)
    fake.flush(mark=marks.BASELINE_FLUSH)
    if after:  # the reference runs on (its calibration loop): read past, never counted
        fake.kernel("later_kernel", 900 * US)
    if edit is not None:
        edit(fake)
    data = b"".join(tracefake.line_bytes(dict(seq=i + 1 if r.pop("__gap__", 0) else i, **r))
                    for i, r in enumerate(fake.lines))
    return data + (b'{"seq":999,"t":"kern' if after else b"")  # the reader stopped mid-line


def test_each_baseline_gets_its_median_device_time_per_call():
    found, why = baseline_clock.device_ms(_reference(), NAMES)
    assert why == ""
    assert found == {"eager": pytest.approx(0.030), "compile": pytest.approx(0.015),
                     "compile:max-autotune": pytest.approx(0.012)}


def _drop(fake: TraceFake) -> None:
    fake.lines.insert(3, {"t": "dropped", "n": 4})


def _gap(fake: TraceFake) -> None:
    fake.lines[5]["__gap__"] = 1  # written with the seq of the next record (to_bytes numbers them)


def _unpaired(fake: TraceFake) -> None:
    ends = [i for i, r in enumerate(fake.lines) if r.get("name") == MARKER and r["grid"][2] == 2]
    del fake.lines[ends[2]]


def _skipped(fake: TraceFake) -> None:
    begins = [r for r in fake.lines if r.get("name") == MARKER and r["grid"][2] == 1]
    ends = [r for r in fake.lines if r.get("name") == MARKER and r["grid"][2] == 2]
    begins[1]["grid"][0] = ends[1]["grid"][0] = 3  # call 2 where call 1 was due


def _backwards(fake: TraceFake) -> None:
    record = next(r for r in fake.lines if r.get("name", "").startswith("runner_0"))
    record["end"] = record["start"] - 1


def _other_stream(fake: TraceFake) -> None:
    ends = [r for r in fake.lines if r.get("name") == MARKER and r["grid"][2] == 2]
    ends[0]["stream"] = 99


# what is wrong with the reference's trace -> the words of why no figure came
BROKEN_ROWS = [
    (_drop, "dropped"),
    (_gap, "seq"),
    (_unpaired, "markers"),
    (_skipped, "out of order"),
    (_backwards, "ending before it starts"),
    (_other_stream, "do not pair"),
]


@pytest.mark.parametrize("edit,why", BROKEN_ROWS, ids=[r[0].__name__ for r in BROKEN_ROWS])
def test_a_reference_trace_that_is_not_whole_gives_no_figure(edit, why):
    found, said = baseline_clock.device_ms(_reference(edit=edit), NAMES)
    assert found == {} and why in said, said


# what came of the trace -> why no figure came
MISSING_ROWS = [
    (b"", "no flush"),
    (b'{"seq":0,"t":"hello","v":1,"pid":1,"cupti":26,"ts":1}\n', "no flush"),
    (b'{"seq":0,"t":"flush","mark":3,"final":0,"ts":1}\n', "no hello"),
    (b'{"seq":0,"t":"flush","mark":3,"final":0,"ts":1,"x":[[[1]]]}\n', "does not decode"),
]


@pytest.mark.parametrize("data,why", MISSING_ROWS)
def test_a_reference_trace_without_its_flush_gives_no_figure(data, why):
    found, said = baseline_clock.device_ms(data, NAMES)
    assert found == {} and why in said, said


def test_markers_of_the_candidate_phases_or_past_the_runners_count_for_no_baseline():
    def candidate_phase(fake: TraceFake) -> None:  # a marker pair of the candidate's `timed` phase
        at = next(i for i, r in enumerate(fake.lines) if r["t"] == "flush")
        fake.lines[at:at] = [dict(r) for r in fake.lines[at - 4:at - 1]]
        for r in fake.lines[at:at + 3]:
            r["corr"] += 10_000
            if r.get("name") == MARKER:
                r["grid"] = [1, marks.TIMED, r["grid"][2]]

    # a fourth runner's phase, which the server did not send (MODES has three runners)
    data = _reference(runners={0: [30.0], 1: [10.0, 5.0], 2: [12.0], 3: [99.0]}, edit=candidate_phase)
    found, why = baseline_clock.device_ms(data, NAMES)
    assert why == "" and found == {"eager": pytest.approx(0.030), "compile": pytest.approx(0.015),
                                   "compile:max-autotune": pytest.approx(0.012)}


# modes -> runner name -> its phase (None: past the runners the markers can tell apart)
PHASE_ROWS = [
    (["default"], "eager", 16),
    (["default"], "compile", 17),
    (["default", "max-autotune"], "compile:max-autotune", 18),
    (["max-autotune"], "compile:max-autotune", 17),
    (["default"], "compile:reduce-overhead", None),
    ([f"m{i}" for i in range(20)], "compile:m15", None),
]


@pytest.mark.parametrize("modes,name,phase", PHASE_ROWS)
def test_each_runner_has_a_phase_of_its_own(modes, name, phase):
    assert marks.baseline_phase(name, modes) == phase
    assert phase is None or phase not in marks.PHASES.values()  # never a candidate phase


def _served(data: bytes, delay_s: float = 0.0) -> tuple[dict, str]:
    ch = channel.open_channel()
    ch.start()
    timings = {name: {"median_ms": 0.05} for name in NAMES}

    def write() -> None:
        time.sleep(delay_s)
        os.write(ch.write_fd, data)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        why = trace_stage.baseline_clock(ch, MODES, timings)
    finally:
        writer.join()
        ch.close()
    return timings, why


def test_the_server_reads_the_device_times_beside_each_baseline():
    timings, why = _served(_reference(), delay_s=0.2)  # the answer came before the reader had the flush
    assert why == ""
    assert timings["eager"]["device_ms"] == pytest.approx(0.030)
    assert timings["compile"]["device_ms"] == pytest.approx(0.015)


def test_the_server_gives_no_figure_from_a_broken_reference_trace(monkeypatch):
    monkeypatch.setattr(trace_stage, "BASELINE_WAIT_S", 0.3)
    timings, why = _served(_reference(edit=_drop))
    assert "dropped" in why and not any("device_ms" in t for t in timings.values())
    timings, why = _served(b"")
    assert "no flush" in why and not any("device_ms" in t for t in timings.values())
    assert trace_stage.baseline_clock(None, MODES, timings) == "no trace"


# a cached baseline's device_ms -> kept or dropped on read
CACHE_ROWS = [(0.03, True), (0, False), (-0.03, False), ("0.03", False), (True, False), (None, False),
              (float("nan"), False), (float("inf"), False)]


@pytest.mark.parametrize("value,kept", CACHE_ROWS)
def test_the_cache_keeps_only_a_finite_positive_device_time(tmp_path, value, kept):
    cache = BaselineCache(tmp_path)
    cache.put("k", {"timings": {"eager": {"median_ms": 0.05, "device_ms": value}}})
    text = (tmp_path / "baselines" / "k.json").read_text()
    assert json.loads(text)  # NaN and Infinity as Python writes them
    entry = cache.get("k")
    assert entry is not None and ("device_ms" in entry["timings"]["eager"]) == kept


def test_the_timer_marks_each_measured_call_and_never_the_warm_up(monkeypatch):
    """Timer.measure hands call i's marker (timing.phase_marker) to each measured call only."""
    sent: list[tuple[int, int, bool]] = []

    class Marks:
        available = True

        def mark(self, *, stream: int, phase: int, index: int, end: bool) -> int:
            sent.append((phase, index, end))
            return 0

    monkeypatch.setattr(timing, "_current_stream_handle", lambda: 7)
    timer = timing.Timer.__new__(timing.Timer)
    given: list = []

    def one_out(fn, inputs, clock_at=None, first=False, mark=None):
        given.append(mark)
        if mark is not None:
            mark(False)
            mark(True)
        return 0.01, 0.01, None

    monkeypatch.setattr(timer, "_one_out", one_out, raising=False)
    monkeypatch.setattr(timer, "_one", lambda fn, inputs: (0.01, 0.01), raising=False)
    monkeypatch.setattr(timer, "raise_clocks", lambda: None, raising=False)
    monkeypatch.setattr(timer, "clock_reader", lambda: None, raising=False)
    monkeypatch.setattr(timer, "sample", lambda event, host: event, raising=False)
    monkeypatch.setattr(timer, "samples", lambda readings: [e for e, _ in readings], raising=False)
    monkeypatch.setattr(timer, "cuda", True, raising=False)
    monkeypatch.setattr(timer, "escaped_ms", lambda readings: 0.0, raising=False)
    phase = marks.baseline_phase("compile", ["default"])
    report = timer.measure(lambda: None, [[]], 0.0, 0.03, 3, 3, budget_s=60.0,
                           mark=timing.phase_marker(Marks(), phase))
    assert report.timing.reps == 3 and len(given) == 3
    assert sent == [(17, i, end) for i in range(3) for end in (False, True)]
    assert timing.phase_marker(None, phase) is None and timing.phase_marker(Marks(), None) is None


def test_the_baselines_stage_stores_each_device_time_beside_its_timing(monkeypatch, tmp_path):
    """server/baselines.run_baselines reads the reference's channel after `baseline_timings`: each
    baseline's device_ms beside its timing, and what the clock met (`device_clock`)."""
    import contextlib
    from types import SimpleNamespace

    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.server import baselines as baselines_mod
    from kernelagent.harness.server.job_record import JobRecord

    monkeypatch.setattr(baselines_mod.protocol, "send", lambda *a, **k: None)
    ch = channel.open_channel()
    ch.start()
    os.write(ch.write_fd, _reference())
    answers = iter([{"type": "warmed"},
                    {"type": "baseline_timings", "errors": {}, "overhead_ms": {},
                     "timings": {name: {**_timing_dict(), "note": ""} for name in NAMES}}])

    @contextlib.contextmanager
    def hold(*a, **k):
        yield SimpleNamespace(busy=False)

    config = EvalConfig(compile_modes=MODES)
    job = SimpleNamespace(ref=object(), config=config, fingerprint={"cuda": True}, to_ref=None, job_id="j",
                          ref_nonce="n", base_seed=1, timed=SimpleNamespace(harness_budget=lambda: 1 << 20),
                          clock=time.monotonic, channels=SimpleNamespace(ref_recv=lambda types, deadline: next(answers)),
                          gate=SimpleNamespace(hold=hold), idle_probe=None, concurrency={}, facts=JobRecord(),
                          flag=lambda item: None, request={"options": {}}, root=tmp_path, ref_trace_channel=ch)
    try:
        baselines_mod.Baselines(job).run_baselines()
    finally:
        ch.close()
    stored = job.facts.baselines
    assert stored["device_clock"] == "trace", stored
    assert stored["timings"]["eager"]["device_ms"] == pytest.approx(0.030)
    assert stored["timings"]["compile:max-autotune"]["device_ms"] == pytest.approx(0.012)


def _timing_dict() -> dict:
    return {"median_ms": 0.05, "q1_ms": 0.05, "q3_ms": 0.05, "min_ms": 0.05, "reps": 5, "meaningful": True,
            "samples_ms": [0.05] * 5}

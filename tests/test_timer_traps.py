"""Timer traps (issue 13, scope 4-5) on the CPU: the driver and NVML wrappers degrade cleanly
without a GPU, and the rules (throttling, flush eviction, launch-bound baselines) decide
correctly on synthetic numbers. The GPU side is in tests/test_timer_traps_gpu.py."""

from __future__ import annotations

import ctypes
import json
from types import SimpleNamespace

import pytest

from kernelagent.harness import protocol
from kernelagent.harness.child import persisting_l2, timing
from kernelagent.harness.result import EvalResult, Flag, Timing, launch_bound_flags, throttling_flag
from kernelagent.harness.server.baselines import baseline_timer_flags


# -- persisting-L2 reset ---------------------------------------------------------------------

def _missing_driver():
    raise OSError("libcuda.so.1: cannot open shared object file")


class FakeDriver:
    """Stands in for libcuda: records calls, holds a carve-out and a stream window."""

    def __init__(self, reset_code=0, carveout=0, drop=()):
        self.calls: list[tuple] = []
        self.carveout = carveout
        self.reset_code = reset_code
        for name in ("cuCtxResetPersistingL2Cache", "cuCtxGetLimit", "cuCtxSetLimit", "cuStreamSetAttribute"):
            if name not in drop:
                setattr(self, name, _Callable(getattr(self, "_" + name)))

    def _cuCtxResetPersistingL2Cache(self):
        self.calls.append(("reset",))
        return self.reset_code

    def _cuCtxGetLimit(self, ref, limit):
        assert limit == timing.PersistingL2.LIMIT_PERSISTING_L2
        ref._obj.value = self.carveout
        return 0

    def _cuCtxSetLimit(self, limit, value):
        self.calls.append(("set_limit", limit, value))
        self.carveout = value
        return 0

    def _cuStreamSetAttribute(self, stream, attr, value):
        raw = ctypes.string_at(value, 64)
        self.calls.append(("window", stream.value, attr, raw))
        return 0


@pytest.fixture
def fake_stream(monkeypatch):
    monkeypatch.setattr(persisting_l2, "_current_stream", lambda: SimpleNamespace(cuda_stream=1234))


def test_no_driver_library_is_recorded_not_raised():
    reset = timing.PersistingL2(loader=_missing_driver)
    reset()  # nothing to call, nothing raised
    assert reset.status.startswith("could not reset") and "no CUDA driver library" in reset.status


def test_reset_clears_lines_carveout_and_window(fake_stream):
    driver = FakeDriver(carveout=8 << 20)
    reset = timing.PersistingL2(loader=lambda: driver)
    reset()
    assert reset.status == "ok"
    assert ("reset",) in driver.calls
    assert ("set_limit", timing.PersistingL2.LIMIT_PERSISTING_L2, 0) in driver.calls
    assert reset.carveout_removed == 8 << 20 and driver.carveout == 0
    window = [c for c in driver.calls if c[0] == "window"]
    # The current stream, the access-policy-window attribute, and a window of 0 bytes (all zeros).
    assert window and window[0][1] == 1234 and window[0][2] == timing.PersistingL2.STREAM_ACCESS_POLICY_WINDOW
    assert window[0][3] == bytes(64)
    driver.calls.clear()
    reset()  # no carve-out any more: the limit is not set again
    assert not any(c[0] == "set_limit" for c in driver.calls)


def test_missing_symbol_and_failing_call_are_recorded_once(fake_stream):
    driver = FakeDriver(reset_code=700, drop=("cuStreamSetAttribute",))
    reset = timing.PersistingL2(loader=lambda: driver)
    reset()
    reset()
    assert driver.calls.count(("reset",)) == 1  # a failing step is not tried again
    assert "no cuStreamSetAttribute" in reset.status and "cuCtxResetPersistingL2Cache failed" in reset.status
    assert reset.status.count("cuCtxResetPersistingL2Cache failed") == 1


def test_device_without_persisting_l2_is_not_a_problem(fake_stream):
    driver = FakeDriver(reset_code=timing.PersistingL2.NOT_SUPPORTED)
    reset = timing.PersistingL2(loader=lambda: driver)
    reset()
    reset()
    assert reset.status == "ok" and driver.calls.count(("reset",)) == 1


# -- NVML -------------------------------------------------------------------------------------

def test_nvml_missing_is_none():
    assert timing.Nvml.open("libnvidia-ml-does-not-exist.so.1") is None


def test_no_clock_reader_without_cuda():
    timer = timing.Timer(__import__("torch").device("cpu"), flush_bytes=1 << 20)
    assert timer.clock_reader() is None
    assert timer.l2_reset.startswith("not applicable")
    assert timer.check_flush(1 << 20)["evicts"] is None
    report = timer.measure(lambda x: x + 1, [[__import__("torch").ones(4)]], 1.0, 2.0, 3, 5, budget_s=5)
    assert report.timing.clocks_mhz == [] and report.timing.reps >= 3


def test_sampler_for_missing_nvml_is_none(monkeypatch):
    monkeypatch.setattr(timing.Nvml, "open", classmethod(lambda cls, name="x": None))
    assert timing.ClockSampler.for_device("GPU-x", "00000000:01:00.0", 0.2) is None


def test_nvml_handle_by_uuid_then_pci_never_index():
    tried = []

    class Lib:
        def nvmlDeviceGetHandleByUUID(self, key, ref):
            tried.append(("uuid", key))
            return 999  # NVML_ERROR_NOT_FOUND

        def nvmlDeviceGetHandleByPciBusId_v2(self, key, ref):
            tried.append(("pci", key))
            ref._obj.value = 42
            return 0

    lib = Lib()
    for name in ("nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId_v2"):
        fn = getattr(lib, name)
        setattr(lib, name, _Callable(fn))
    handle = timing.Nvml(lib).handle("GPU-abc", "00000000:3b:00.0")
    assert handle.value == 42
    assert tried == [("uuid", b"GPU-abc"), ("pci", b"00000000:3b:00.0")]
    assert timing.Nvml(lib).handle(None, None) is None


class _Callable:
    """A Python function that accepts ctypes' argtypes/restype attributes."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


# -- the rules --------------------------------------------------------------------------------

def test_first_last_decile():
    points = [(i, 2000.0 if i < 10 else 1500.0) for i in range(100)]
    assert timing.first_last_decile(points) == [2000.0, 1500.0]
    assert timing.first_last_decile([(0.0, 1980.0), (1.0, 1700.0)]) == [1980.0, 1700.0]
    assert timing.first_last_decile([(0.0, 1980.0)]) is None
    assert timing.first_last_decile([]) is None


@pytest.mark.parametrize("clocks, flagged", [
    ([1980, 1700], True),    # 14% lower
    ([1980, 1790], False),   # 9.6% lower: within the rule
    ([1500, 1980], False),   # rose: not throttling
    ([1980, 1782], False),   # exactly 10%
    ([1980, 1781], True),
    ([], False), (None, False), ([0, 100], False), (["a", "b"], False),
])
def test_throttling_rule(clocks, flagged):
    flag = throttling_flag("eager baseline's", clocks)
    assert (flag is not None) == flagged
    if flag:
        assert flag.kind == "throttling" and flag.severity == "info"
        assert f"{clocks[0]:.0f} MHz" in flag.message and f"{clocks[1]:.0f} MHz" in flag.message


def test_throttling_message_gives_the_deciles_call_times():
    samples = [1.0] * 10 + [1.05] * 80 + [1.2] * 10
    flag = throttling_flag("candidate's", [1980, 1600], samples)
    assert "1.0000 ms in the first tenth, 1.2000 ms in the last" in flag.message
    assert "median call" not in throttling_flag("candidate's", [1980, 1600], samples[:5]).message


def test_clock_sampler_on_synthetic_clocks():
    readings = iter([1980] * 3 + [1900] * 20 + [1600] * 1000)
    closed = []
    sampler = timing.ClockSampler(lambda: next(readings), 0.001, close=lambda: closed.append(True))
    sampler.start()
    import time

    time.sleep(0.08)
    clocks = sampler.stop()
    assert closed == [True]
    assert clocks is not None and clocks[0] > clocks[1] and clocks[1] == 1600.0
    assert throttling_flag("candidate's", clocks) is not None


def test_clock_sampler_ignores_failing_reads():
    def broken():
        raise OSError("gone")

    sampler = timing.ClockSampler(broken, 0.001)
    sampler.start()
    assert sampler.stop() is None


@pytest.mark.parametrize("cold, warm, evicts", [(0.012, 0.005, True), (0.0059, 0.005, False),
                                                 (0.0061, 0.005, True), (0.01, 0.0, False)])
def test_flush_rule(cold, warm, evicts):
    assert timing.flush_evicts(cold, warm) is evicts


def _timing(median, empty=None, meaningful=True, clocks=()):
    return Timing(median_ms=median, q1_ms=median, q3_ms=median, min_ms=median, reps=10, meaningful=meaningful,
                  empty_call_ms=empty, clocks_mhz=list(clocks))


def test_launch_bound_rule():
    timings = {"candidate": _timing(0.001, 0.1), "eager": _timing(0.030, 0.020), "compile": _timing(0.100, 0.030),
               "compile:reduce-overhead": _timing(0.039, 0.020), "slow": _timing(0.041, 0.020),
               "cpu": _timing(0.001, 0.02, meaningful=False), "unknown": _timing(0.001)}
    flags = launch_bound_flags(timings)
    assert sorted(f.message.split()[1] for f in flags) == ["compile:reduce-overhead", "eager"]
    assert all(f.kind == "launch-bound" and f.severity == "info" and "launch overhead" in f.message for f in flags)


def test_baseline_flags_from_the_servers_dicts():
    timings = {"eager": {**_timing(0.01, 0.008).__dict__, "clocks_mhz": [1980.0, 1500.0]},
               "compile": {**_timing(1.0, 0.03).__dict__, "clocks_mhz": [1980.0, 1970.0]},
               "broken": {"median_ms": "x"}}
    kinds = sorted((f["kind"], f["severity"]) for f in baseline_timer_flags(timings))
    assert kinds == [("launch-bound", "info"), ("throttling", "info")]


# -- data: result, protocol ------------------------------------------------------------------

def test_result_round_trip_keeps_overhead_and_clocks():
    result = EvalResult(status="correct", timings={"candidate": _timing(0.5, clocks=(1980, 1970)),
                                                   "eager": _timing(1.0, 0.02), "compile": _timing(0.8, 0.05)},
                        flags=[Flag("launch-bound", "m", "info")])
    data = json.loads(json.dumps(result.to_dict()))
    assert data["baseline_overhead_ms"] == {"eager": 0.02, "compile": 0.05}
    assert data["timings"]["candidate"]["clocks_mhz"] == [1980, 1970]
    back = EvalResult.from_dict(data)
    assert back.baseline_overhead_ms == result.baseline_overhead_ms
    assert back.timings["candidate"].clocks_mhz == [1980, 1970]
    assert "empty call 0.0200 ms" in back.feedback()
    # An older result or cache entry without the new fields still loads.
    old = {k: v for k, v in data["timings"]["eager"].items() if k not in ("clocks_mhz", "empty_call_ms")}
    assert Timing.from_dict(old).empty_call_ms is None and Timing.from_dict(old).clocks_mhz == []


def test_protocol_baseline_timings_carries_overhead():
    raw = protocol.encode("baseline_timings", "j", "n", timings={}, errors={}, overhead_ms={"eager": 0.01,
                                                                                              "compile": None})
    message = protocol.decode(raw, {"baseline_timings"}, "j", "n")
    assert message["overhead_ms"] == {"eager": 0.01, "compile": None}
    with pytest.raises(protocol.ProtocolError, match="overhead_ms"):
        protocol.decode(protocol.encode("baseline_timings", "j", "n", timings={}, errors={}),
                        {"baseline_timings"}, "j", "n")


def test_render_shows_overhead_and_clocks():
    from rich.console import Console

    from kernelagent.cli.render import render_result

    result = EvalResult(status="correct", correct=True,
                        timings={"candidate": _timing(0.5, clocks=(1980, 1700)), "eager": _timing(1.0, 0.0213)},
                        speedups={"eager": 2.0})
    console = Console(record=True, width=160)
    render_result(result, console)
    text = console.export_text()
    assert "empty call 0.0213 ms" in text
    assert "SM clock 1980->1700 MHz" in text


# -- end to end on the CPU ------------------------------------------------------------------

def test_cpu_evaluation_reports_each_baselines_empty_call(tmp_path, fast_config, relu_problem):
    """A fresh (uncached) evaluation times eager's empty call in the reference process; it
    reaches the result, the JSON and `kernelagent eval`'s output."""
    from typer.testing import CliRunner

    from kernelagent.cli import app
    from tests.conftest import CANDIDATES

    run = CliRunner().invoke(app, ["eval", str(relu_problem), str(CANDIDATES / "relu_good.py"), "--trials", "2",
                                   "--json", "--cache-dir", str(tmp_path)], env={"COLUMNS": "120", "TERM": "dumb"})
    assert run.exit_code == 0, run.output
    data = json.loads(run.stdout)
    assert not data["baselines_cached"]
    overhead = data["baseline_overhead_ms"]
    assert set(overhead) == {"eager"} and overhead["eager"] > 0
    assert data["timings"]["eager"]["empty_call_ms"] == overhead["eager"]
    assert data["fingerprint"].get("l2_flush") is None  # no GPU: no flush to check
    assert not any(f["kind"] == "launch-bound" for f in data["flags"])  # CPU times are not meaningful
    # Again, from the baseline cache: the empty-call time is cached with the baseline and shown.
    shown = CliRunner().invoke(app, ["eval", str(relu_problem), str(CANDIDATES / "relu_good.py"), "--trials", "2",
                                     "--cache-dir", str(tmp_path)], env={"COLUMNS": "160", "TERM": "dumb"})
    assert shown.exit_code == 0, shown.output
    assert "from cache" in shown.output
    assert f"empty call {overhead['eager']:.4f} ms" in shown.output


def test_launch_cover_is_a_validated_timing_setting():
    from kernelagent.harness.config import EvalConfig

    default = EvalConfig()
    assert default.launch_cover_us > 0  # on by default: events time the device's work
    # A different cover changes what a baseline measures, so cached baselines must not be reused.
    assert EvalConfig(launch_cover_us=0).timing_key() != default.timing_key()
    for bad in (float("nan"), -1.0, 1e9):
        with pytest.raises(ValueError, match="launch_cover_us"):
            EvalConfig(launch_cover_us=bad)
    # On the CPU there is nothing to cover: no spin, and the timer still measures.
    timer = timing.Timer(__import__("torch").device("cpu"), flush_bytes=0, launch_cover_us=250.0)
    assert timer.cover_cycles == 0


@pytest.mark.parametrize("elapsed_ms, rate", [(0.1, 2000.0), (1e-6, 4000.0), (1e6, 100.0)])
def test_launch_cover_is_sized_from_a_physical_clock(monkeypatch, elapsed_ms, rate):
    """The cover's spin is sized from a timed spin in the candidate's own process. A forged event
    timer (elapsed ~0) must not size a cover of minutes (which held the device and the timing
    slot until the stage limit on an H100): the rate is bounded by the clocks GPUs run at."""

    class Event:
        def __init__(self, enable_timing=True):
            pass

    spins = []
    monkeypatch.setattr(timing, "_cuda_sleep", spins.append)
    monkeypatch.setattr(timing, "_CudaEvent", Event)
    monkeypatch.setattr(timing, "_event_record", lambda event: None)
    monkeypatch.setattr(timing, "_cuda_synchronize", lambda: None)
    monkeypatch.setattr(timing, "_event_elapsed", lambda start, end: elapsed_ms)
    cycles = timing.Timer._cover_cycles(None, 10.0)
    assert cycles == int(rate * 10.0)
    assert spins and max(spins) <= 2_000_000


@pytest.mark.parametrize("event, host, expected", [
    # the two readings of the same work: the events', less their empty pair's 1.25 us
    (0.18346, 0.18384 + 0.160, 0.18221),
    # host a little above (noise, within 2 us / 2%): still the events'
    (0.1000, 0.1015 + 0.160, 0.09875),
    # launch time past the cover, or work outside the timed stream: the host's
    (0.0050, 0.0300 + 0.160, 0.02875),
    (0.2000, 0.2100 + 0.160, 0.20875),
    # an empty event pair longer than the reading never goes negative
    (0.0005, 0.0004 + 0.160, 0.0),
])
def test_a_call_is_timed_by_its_events_unless_the_host_saw_clearly_more(event, host, expected):
    """A plain max of the two readings took the larger of two noisy readings of the same work (an
    H100 softmax read 1.7% over the profiler's sum); the host's counts only past the margin."""
    import torch

    timer = timing.Timer(torch.device("cpu"), flush_bytes=0)
    timer.overhead_ms, timer.event_ms = 0.160, 0.00125
    assert timer.sample(event, host) == pytest.approx(expected, abs=1e-9)


def test_no_garbage_collection_inside_a_timed_loop():
    """A full collection (milliseconds with torch imported) inside a host reading was taken as a
    call's time; the loops run with the collector off and turn it back on after."""
    import gc

    import torch

    from kernelagent.harness.child import persisting_l2, timing

    seen = []

    def call(x):
        seen.append(gc.isenabled())
        return x + 1

    timer = timing.Timer(torch.device("cpu"), flush_bytes=0)
    x = torch.ones(4)
    assert gc.isenabled()
    timing.FixedLoop(timer).run(call, [[x]] * 6, warmup_calls=2, calls=4)
    timer.measure(call, [[x]], warmup_ms=1, target_ms=2, min_reps=3, max_reps=5, budget_s=5)
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:  # a caller that had it off keeps it off
        timing.FixedLoop(timer).run(call, [[x]] * 3, warmup_calls=1, calls=2)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_host_reading_is_chosen_for_the_loop_not_for_single_calls():
    """Host noise hits some calls and was taken per call (an honest 11 us kernel's mean ran 1.6x
    its median on an H200 and the server's median check flagged it); work that escapes the
    events does so in every call, and the median call shows it."""
    import torch

    from kernelagent.harness.child import persisting_l2, timing

    timer = timing.Timer(torch.device("cpu"), flush_bytes=0)
    timer.event_ms, timer.overhead_ms = 0.001, 0.02
    honest = [(0.012, 0.012 + 0.02 + (0.03 if i % 3 == 0 else 0.0)) for i in range(30)]  # 1 call in 3: host noise
    got = timer.samples(honest)
    assert got == [pytest.approx(0.011)] * 30  # the events, for every call
    escaping = [(0.002, 0.012 + 0.02) for _ in range(30)]  # the work on another stream, every call
    assert timer.samples(escaping) == [pytest.approx(0.011)] * 30  # the host readings
    # hiding work in fewer than half of the calls does not lower the median
    partly = [(0.002, 0.032) if i % 5 < 2 else (0.012, 0.032) for i in range(30)]
    import statistics

    assert statistics.median(timer.samples(partly)) == pytest.approx(0.011)
    assert timer.samples([]) == []


def test_a_call_taken_by_the_host_never_reads_below_its_own_events():
    """The host reading has the device's time from `before` to `start` taken off, and a host
    descheduled between queueing `before` and reading t0 loses that time too: one call's host
    reading fell to 0.0 ms, and a zero sample broke the protocol (an honest 8 us ReLU rejected on
    an H100, 2026-11-27). Where the loop takes the host's readings, a call keeps at least its
    events'."""
    import torch

    timer = timing.Timer(torch.device("cpu"), flush_bytes=0)
    timer.event_ms, timer.overhead_ms = 0.001, 0.02
    escaping = [(0.004, 0.012 + 0.02) for _ in range(29)] + [(0.0095, 0.0)]  # the last: the host lost time
    got = timer.samples(escaping)
    assert got[:29] == [pytest.approx(0.011)] * 29  # the loop takes the host's readings
    assert got[29] == pytest.approx(0.0085) and all(x > 0 for x in got)


def test_a_call_that_ran_nothing_between_its_events_is_no_broken_protocol():
    """GPU suite (H200): a candidate whose forward returns at once while a thread launches its
    kernel later (c04_thread_deferred) had calls whose events read no more than an empty pair's.
    The timer, our code in its process, reported them as 0.0 ms; the server rejects a zero as a
    broken protocol, which cut the loop short before the kernel trace could name the hidden work
    (the test expecting `hidden-work` failed on the race). Such a call reads MIN_SAMPLE_MS."""
    import torch

    from kernelagent.harness.server.timed import check_samples

    timer = timing.Timer(torch.device("cpu"), flush_bytes=0)
    timer.event_ms, timer.overhead_ms = 0.00128, 0.006
    nothing = [(0.00128, 0.007), (0.001, 0.0075), (0.00128, 0.0)] * 10
    got = timer.samples(nothing)
    assert len(got) == 30 and min(got) > 0 and min(got) == timing.MIN_SAMPLE_MS
    check_samples(got, segment_s=0.001)  # a finite, positive time for every call: no protocol error


def test_the_empty_event_pair_taken_off_every_call_is_the_least_read(monkeypatch):
    """A disturbed empty pair (the host late to queue `end`) reads long, and it is taken off every
    call's event reading: with the median, a 0.19 ms matvec read 0.115 ms on an H100. The least
    of the reads counts; the host overhead stays the median (a least host overhead would take the
    host's reading for honest calls)."""
    import torch

    reads = iter([(0.072, 0.080)] * 12 + [(0.0013, 0.0090), (0.0012, 0.0110)] + [(0.070, 0.079)] * 6)
    timer = timing.Timer(torch.device("cpu"), flush_bytes=0)
    monkeypatch.setattr(timer, "_one", lambda fn, inputs: next(reads))
    overhead = timer.overhead_ms = timer._calibrate()
    assert timer.event_ms == pytest.approx(0.0012)
    assert overhead == pytest.approx(0.008)  # the median of host - event
    # a 0.19 ms call's event reading keeps its own time
    assert timer.samples([(0.1912, 0.1912 + overhead)] * 5) == [pytest.approx(0.19)] * 5


def test_each_segments_first_call_gets_the_longer_cover(monkeypatch):
    """A segment's first call follows the server's pause (its check of the kept outputs): on an
    H100 its launch outran the 150 us spin and a 0.073 ms batchnorm read 0.12 ms in every such
    call. FixedLoop covers the first call of each run (segment) FIRST_COVER_FACTOR times longer, and
    the calibration's loop is the same FixedLoop, so the server subtracts the same spins."""
    import torch

    spins: list[int] = []

    class Event:
        def __init__(self, enable_timing=True):
            pass

    timer = timing.Timer(torch.device("cpu"), flush_bytes=0)
    # a CUDA timer's spin, without a GPU: the cover is what _cuda_sleep is asked for
    timer.cuda, timer.cover_us, timer.cover_cycles = True, 150.0, 1000
    timer.first_cover_cycles = int(timer.cover_cycles * timing.FIRST_COVER_FACTOR)
    monkeypatch.setattr(timing, "_cuda_sleep", spins.append)
    monkeypatch.setattr(timing, "_CudaEvent", Event)
    monkeypatch.setattr(timing, "_event_record", lambda event: None)
    monkeypatch.setattr(timing, "_cuda_synchronize", lambda: None)
    monkeypatch.setattr(timing, "_event_elapsed", lambda start, end: 0.05)
    loop = timing.FixedLoop(timer)
    sets = [[torch.ones(3)] for _ in range(8)]
    for warmup, calls in ((0, 3), (2, 2), (0, 1)):  # three segments, one with warm-up calls
        spins.clear()
        report = loop.run(lambda x: x + 1, sets, warmup, calls)
        assert report.timing.reps == calls
        assert spins == [int(1000 * timing.FIRST_COVER_FACTOR)] + [1000] * (warmup + calls - 1), (warmup, calls, spins)
    assert timing.FIRST_COVER_FACTOR >= 2  # measured: 300 us and more covered the first launch

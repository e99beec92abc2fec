"""The timer, shared by the candidate and the baselines so that both are measured alike.

This module is imported by the harness server before any candidate exists, and binds the
clock functions it uses at that moment: a candidate that later patches `time.perf_counter`,
`torch.cuda.synchronize` or `torch.cuda.Event` does not change what this timer calls.

Each timed iteration, on CUDA:
    reset persisting L2 lines (driver) and the current stream's access-policy window
    flush L2 (write a buffer larger than L2)  -> device-wide synchronize
    event -> host clock t0 -> GPU spin (launch cover) -> start event -> fn(*inputs) -> end event
        -> device-wide synchronize -> t1; the host reading is t1 - t0 less the device's time from
        the first event to the start event
The calls' times are their event times less the cost of an empty event pair, unless the host
times less the host overhead are clearly larger in the loop's median call (HOST_MARGIN_MS,
HOST_MARGIN_REL), then the host times of every call (`Timer.samples`). The event time is
precise for work on the current stream; the host time, taken after a device-wide synchronize,
includes work that the candidate pushed to other streams or left running, and the host's own
noise. Work that escapes the events does so in every call, so the median call shows it; host
noise hits some calls, and a per-call choice took it, stretching an honest tiny kernel's
claimed mean until the server's check of the median against its own segments flagged it (a
plain max of the two readings took the larger of two noisy readings of the same work:
docs/concepts/timing.md, first bullet). A candidate that hides work in fewer than half of its
calls cannot lower the median it is judged on, and the server's clock checks the mean. When
the host time is the larger by a clear margin, the result is flagged.

The spin: without it the device sits idle, synchronised, while the host launches the call,
so every event time held the call's launch latency (Python, Triton's launcher, torch.compile's
guards), well above the device time a profiler sums for the same calls (docs/concepts/timing.md,
"Launch latency"). A spin of
`launch_cover_us` queued first keeps the device busy while the host enqueues the call, so
the start event fires when the call's work is already queued, and the events time the
device's work. Launch time beyond the spin is still counted (through the host time), and the
empty-call overhead measured with the same spin is subtracted, so the server's calibration
loop and the candidate's loop pay it alike.

Known traps, and what this module does about each:
- A persisting-L2 access-policy window survives a flush (persisting lines are not evicted by
  normal writes): before every call the driver's `cuCtxResetPersistingL2Cache` returns them
  to normal, any persisting carve-out (`CU_LIMIT_PERSISTING_L2_CACHE_SIZE`) is set back to 0,
  and the current stream's window is cleared. Where the driver lacks a symbol, the Timer
  records that (`l2_reset`) and goes on: it never fails an evaluation.
- A flush that does not evict: `check_flush` reads a buffer of a quarter of L2 right after
  a flush and again without one; the flush evicts when the flushed read is at least
  FLUSH_EVICTS_RATIO times slower. The server's device probe runs it once.
- Clocks that drop during a loop: `measure` reads the SM clock through NVML (ctypes,
  libnvidia-ml.so.1) on about 30 evenly spaced calls, between the flush and the synchronize
  (outside the timed region, while the device is busy), and reports the means of the first
  and last decile as `Timing.clocks_mhz`; `ClockSampler` does the same from a thread (the
  server, around the candidate's loop). A drop of more than 10% (result.THROTTLE_DROP) is the flag
  `throttling`. Without NVML nothing is recorded.

The driver and NVML calls live beside this module: child/persisting_l2.py (the persisting-L2
reset) and child/sm_clocks.py (NVML, the SM clock readings and ClockSampler); both are imported
here, so they are bound before any candidate exists too.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from kernelagent.harness.result import Timing
from kernelagent.harness.child.persisting_l2 import PersistingL2
from kernelagent.harness.child.sm_clocks import CLOCK_SAMPLES, first_last_decile, sm_clock_reader
from kernelagent.harness.child.sm_clocks import ClockSampler, Nvml, torch_device_ids  # noqa: F401 - their old home
from kernelagent.harness.stats import quantile

if TYPE_CHECKING:
    from kernelagent.harness.trace.marks import Marks

SM_MHZ_RANGE = (100.0, 4000.0)  # SM clocks any GPU runs at (cycles per microsecond)

# Bound now, before any candidate code runs in this process.
_perf_counter = time.perf_counter
_cuda_synchronize = torch.cuda.synchronize
_CudaEvent = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_no_grad = torch.no_grad
_cuda_sleep = getattr(torch.cuda, "_sleep", None)  # spins the current stream for N clock cycles
_current_stream = torch.cuda.current_stream
_gc_disable, _gc_enable, _gc_isenabled = gc.disable, gc.enable, gc.isenabled


@contextlib.contextmanager
def _no_collection() -> Any:
    """No garbage collection inside a timed loop (as timeit does): with torch imported, a full
    collection takes milliseconds, which would land in one call's readings. Collections happen
    between segments. (It was not what stretched honest tiny kernels' host readings on an H200:
    those stayed with the collector off, and the loop-wide rule, Timer.samples, answers them.)"""
    was = _gc_isenabled()
    _gc_disable()
    try:
        yield
    finally:
        if was:
            _gc_enable()


@dataclass
class TimingReport:
    timing: Timing
    escaped_ms: float = 0.0  # median host time beyond the event time, overhead removed
    samples_ms: list[float] = field(default_factory=list)


# A flushed read of a buffer a quarter the size of L2 must take at least this many times as long
# as a second, unflushed read of it for the flush to count as evicting (HBM is 2-3x slower than
# an L2 hit on the GPUs we target; launch overhead in both reads narrows the gap, hence 1.2).
FLUSH_EVICTS_RATIO = 1.2
# Busy time before a loop's first call, to bring the SM clock up from idle (Timer.raise_clocks).
CLOCK_RAMP_MS = 20.0


# The first call of every FixedLoop run (a segment's first, after the server's `go`) is covered
# this many times longer: after the server's pause the host's first launch is slower and
# outran a plain cover, so the device idled inside the events (docs/concepts/timing.md, "The
# last miss, `27_batchnorm_eval`, was the launch cover"). The calibration's loop runs the same
# FixedLoop, so the server subtracts the longer spin too; a candidate that skips it is credited
# at most (FIRST_COVER_FACTOR - 1) * cover once per segment, and Nsight Compute's sum catches a
# claim well below the kernels' own time (server/kernel_evidence.py).
FIRST_COVER_FACTOR = 2.0

# The host's reading replaces the events' only beyond this margin (launch time past the cover,
# work outside the timed stream): within it the two read the same work and the host's is noisier.
HOST_MARGIN_MS = 0.002
HOST_MARGIN_REL = 0.02
# A call whose events read no more than an empty pair's (nothing of it ran between them: its work
# hidden in a thread, say) is reported at this, not 0: a zero is a broken protocol (the server's
# check_samples), which cut such a loop short before the kernel trace could name the hidden work.
MIN_SAMPLE_MS = 1e-6


class Timer:
    def __init__(self, device: torch.device, flush_bytes: int, flush_l2: bool = True,
                 launch_cover_us: float = 0.0):
        self.device = device
        self.cuda = device.type == "cuda"
        # The launch cover (module docstring): spin cycles, sized once from a measured spin.
        self.cover_us = float(launch_cover_us)
        self.cover_cycles = self._cover_cycles(launch_cover_us) if self.cuda and launch_cover_us > 0 else 0
        self.first_cover_cycles = int(self.cover_cycles * FIRST_COVER_FACTOR)
        self.flush_buffer = None
        if self.cuda and flush_l2:
            self.flush_buffer = torch.empty(max(flush_bytes // 4, 1), dtype=torch.int32, device=device)
        # Before every call: undo any persisting-L2 setup (see PersistingL2); `l2_reset` says
        # whether that worked.
        self.persisting = PersistingL2() if self.cuda else None
        self._clock_read: Any = False  # the NVML reader, opened on first use (False: not yet)
        self._clock_points: list[tuple[float, float]] = []
        self.overhead_ms = 0.0
        self.event_ms = 0.0  # the events' own time for an empty call (start, end, nothing between)
        if self.cuda:
            self.overhead_ms = self._calibrate()

    def samples(self, readings: list[tuple[float, float]]) -> list[float]:
        """The calls' times from their (event, host) readings, decided for the loop as a whole
        (module docstring): the event times, or the host times when the median call's host time
        exceeds its event time by the margin."""
        if not readings:
            return []
        device = [max(event - self.event_ms, MIN_SAMPLE_MS) for event, _host in readings]
        host = [max(h - self.overhead_ms - self.event_ms, MIN_SAMPLE_MS) for _event, h in readings]
        typical = quantile(sorted(device), 0.5)
        gap = quantile(sorted(h - d for d, h in zip(device, host)), 0.5)
        if gap <= max(HOST_MARGIN_MS, HOST_MARGIN_REL * typical):
            return device
        # A call's host reading can fall below its own events (the host descheduled between
        # queueing `before` and reading t0 takes that time off): such a call keeps its events'
        # reading, since a zero sample is a broken protocol (rejected; docs/concepts/timing.md,
        # first bullet).
        return [max(h, d) for d, h in zip(device, host)]

    def escaped_ms(self, readings: list[tuple[float, float]]) -> float:
        """What a loop reports as escaped work (TimingReport.escaped_ms): the median call's raw
        host time beyond its event time, the empty call's overhead taken off; 0 off CUDA."""
        if not self.cuda or not readings:
            return 0.0
        return max(quantile(sorted(host - self.overhead_ms - event for event, host in readings), 0.5), 0.0)

    def sample(self, event: float, host: float) -> float:
        """One call's time from its two readings, alone (the warm-up's estimate)."""
        device = max(event - self.event_ms, 0.0)
        # overhead_ms is an empty call's host time less its events' time, so the host reading
        # less it still holds one empty event pair, as the event reading does
        host = max(host - self.overhead_ms - self.event_ms, 0.0)
        return host if host > device + max(HOST_MARGIN_MS, HOST_MARGIN_REL * device) else device

    @property
    def l2_reset(self) -> str:
        return self.persisting.status if self.persisting is not None else "not applicable (no CUDA)"

    def _flush(self) -> None:
        if self.persisting is not None:
            self.persisting()
        if self.flush_buffer is not None:
            self.flush_buffer.zero_()

    def _cover_cycles(self, cover_us: float) -> int:
        """Cycles of torch.cuda._sleep that last about `cover_us` at the SM clock the device
        runs at when busy: a 2 ms spin first brings the clock up, then three timed spins give
        the rate. 0 where torch has no _sleep."""
        if _cuda_sleep is None:
            return 0
        probe = 200_000
        _cuda_sleep(2_000_000)
        rates = []
        for _ in range(3):
            start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
            _event_record(start)
            _cuda_sleep(probe)
            _event_record(end)
            _cuda_synchronize()
            ms = _event_elapsed(start, end)
            if ms > 0:
                rates.append(probe / (ms * 1e3))  # cycles per microsecond
        if not rates:
            return 0
        # A rate is a clock in MHz: one outside what any GPU runs at came from a forged event
        # timer (a candidate patching `_event_elapsed` to report ~0 would otherwise size a cover
        # of minutes, holding the device and the timing slot for its whole stage limit).
        return int(min(max(max(rates), SM_MHZ_RANGE[0]), SM_MHZ_RANGE[1]) * cover_us)

    def _cover(self, first: bool = False) -> None:
        if self.cover_cycles:
            _cuda_sleep(self.first_cover_cycles if first else self.cover_cycles)

    def raise_clocks(self) -> None:
        """Keep the device busy for about CLOCK_RAMP_MS before a loop's first call. An idle H100
        sat at 345-800 MHz between evaluations (NVML) and ramps up under load, so a loop that
        starts cold times its first calls slow (the last quarter of a small kernel's samples
        read 0.6-2x its first). Outside every timed region; nothing where there is no spin."""
        if self.cover_cycles:
            _cuda_sleep(int(self.cover_cycles * CLOCK_RAMP_MS * 1e3 / max(self.cover_us, 1.0)))
            _cuda_synchronize()

    def clock_reader(self) -> Callable[[], int | None] | None:
        """The SM clock reader for this device (NVML), or None."""
        if self._clock_read is False:
            self._clock_read = sm_clock_reader(self.device) if self.cuda else None
        return self._clock_read

    def _one(self, fn: Callable[..., Any], inputs: list[Any]) -> tuple[float, float]:
        """(event ms, host ms) of one call."""
        event, host, _out = self._one_out(fn, inputs)
        return event, host

    def _one_out(self, fn: Callable[..., Any], inputs: list[Any], clock_at: int | None = None,
                 first: bool = False, mark: Callable[[bool], Any] | None = None) -> tuple[float, float, Any]:
        """(event ms, host ms, output) of one call. With `clock_at`, the SM clock is read after
        the flush is queued and before the synchronize, outside the timed region while the device
        is busy, and kept as (clock_at, MHz). `first`: the call after a pause, under the longer
        cover (FIRST_COVER_FACTOR). `mark(end)`: the kernel trace's marker (issue 55), launched
        after the cover and before the start event, and after the call's synchronize: outside
        both readings (the cover hides the first's launch), with neither the L2 flush nor the
        cover's spin inside the call's marked span."""
        if not self.cuda:
            t0 = _perf_counter()
            out = fn(*inputs)
            host = (_perf_counter() - t0) * 1e3
            return host, host, out
        self._flush()
        if clock_at is not None and self._clock_read:
            mhz = self._clock_read()
            if mhz:
                self._clock_points.append((clock_at, float(mhz)))
        _cuda_synchronize()
        start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
        before = _CudaEvent(enable_timing=True) if self.cover_cycles else None
        if before is not None:
            _event_record(before)  # on an idle device: it fires as it is queued, just before t0
        t0 = _perf_counter()
        self._cover(first)
        if mark is not None:
            mark(False)
        _event_record(start)
        out = fn(*inputs)
        _event_record(end)
        _cuda_synchronize()
        host = (_perf_counter() - t0) * 1e3
        if mark is not None:
            mark(True)
        if before is not None:
            # From `before` to `start` on the device clock (the host's own launch of the spin and
            # the spin itself) comes off the host reading, which is then the time from the start
            # event to the host's wake-up. Without this the host reading held the Python time
            # spent queueing the spin, longer in a real loop's calls than in the calibration's
            # empty ones, and the spin's cycles, which last longer when a power-hungry kernel
            # pulls the SM clock down, so the host rule took readings above the events
            # (docs/concepts/timing.md, first bullet). All of the call's code runs after `start`
            # is queued, so none of it is taken off.
            host -= _event_elapsed(before, start)
        return _event_elapsed(start, end), host, out

    def _calibrate(self) -> float:
        """Host time of an empty timed iteration (clock, two events, one synchronize) beyond its
        events' (the median of 20 reads), and the events' own time for it (`event_ms`, the least
        of the 20: it is taken off every call's event reading, and a disturbance only ever adds
        to it). An empty pair reads more than its own cost when the host records `end` after the
        cover's spin has run out (a process descheduled on a busy host), and an inflated empty
        pair is the one path found that lowers every event reading alike, hence the least (the
        loop reports both, `timed_loop.empty_call_ms`). The host overhead stays the median: a
        least one sends more loops to the host's noisier readings (docs/concepts/timing.md, "One
        non-repeating miss, two runs back")."""
        samples, events = [], []
        for _ in range(20):
            event, host = self._one(lambda: None, [])
            samples.append(host - event)
            events.append(event)
        samples.sort()
        self.event_ms = max(min(events), 0.0)
        return max(quantile(samples, 0.5), 0.0)

    def measure(self, fn: Callable[..., Any], input_sets: list[list[Any]], warmup_ms: float,
                target_ms: float, min_reps: int, max_reps: int, budget_s: float,
                mark: Callable[[int], Callable[[bool], Any]] | None = None) -> TimingReport:
        """Warm up, choose the repetition count from the warm-up's speed, then measure,
        cycling through `input_sets`. Stops early (with fewer reps) past `budget_s`. `mark(i)`:
        the kernel trace's marker of measured call i (`phase_marker`; the warm-up is unmarked).

        One running index covers the warm-up and the measured calls, so a sequence that
        hands out a new set per index (inputs.FreshInputs) never repeats one: a warm-up
        call cannot prime an output cache for the measured calls."""
        started = _perf_counter()
        with _no_grad(), _no_collection():
            calls = 0
            warm: list[float] = []
            self.raise_clocks()
            warm_started = _perf_counter()
            while len(warm) < 2 or ((_perf_counter() - warm_started) * 1e3 < warmup_ms and len(warm) < 100):
                event, host = self._one(fn, input_sets[calls % len(input_sets)])
                calls += 1
                warm.append(self.sample(event, host))
                if _perf_counter() - started > budget_s / 2:
                    break
            estimate = max(sorted(warm)[len(warm) // 2], 1e-4)
            reps = int(min(max(math.ceil(target_ms / estimate), min_reps), max_reps))
            readings: list[tuple[float, float]] = []
            self._clock_points = []
            every = max(1, reps // CLOCK_SAMPLES) if self.clock_reader() else 0
            for i in range(reps):
                at = i if every and (i % every == 0 or i == reps - 1) else None
                event, host, out = self._one_out(fn, input_sets[calls % len(input_sets)], clock_at=at,
                                                 mark=mark(i) if mark is not None else None)
                del out
                calls += 1
                readings.append((event, host))
                if _perf_counter() - started > budget_s and len(readings) >= 3:
                    break
        samples = self.samples(readings)
        ordered = sorted(samples)
        timing = Timing(
            median_ms=quantile(ordered, 0.5),
            q1_ms=quantile(ordered, 0.25),
            q3_ms=quantile(ordered, 0.75),
            min_ms=ordered[0],
            reps=len(ordered),
            meaningful=self.cuda,
            note="" if self.cuda else "CPU wall clock (Triton interpreter): not meaningful",
            clocks_mhz=first_last_decile(self._clock_points) or [],
        )
        return TimingReport(timing=timing, escaped_ms=self.escaped_ms(readings), samples_ms=samples)

    def _event_ms(self, fn: Callable[[], Any]) -> float:
        start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
        self._cover()  # without it, the flush probe's reads timed mostly their launch (20-40 us)
        _event_record(start)
        fn()
        _event_record(end)
        _cuda_synchronize()
        return _event_elapsed(start, end)

    def check_flush(self, l2_bytes: int, repeats: int = 9) -> dict[str, Any]:
        """Does the flush evict? A buffer a quarter the size of L2 is read (a sum) right after
        the flush ("cold") and then again without one ("warm"), `repeats` times; the flush evicts
        when the median cold read takes at least FLUSH_EVICTS_RATIO times the median warm read."""
        rule = f"a flushed read takes >= {FLUSH_EVICTS_RATIO}x a second, unflushed read"
        if not self.cuda:
            return {"evicts": None, "rule": rule, "note": "no CUDA device: no L2 flush"}
        if self.flush_buffer is None:
            return {"evicts": False, "rule": rule, "note": "the L2 flush is off (flush_l2=False)"}
        numel = max(int(l2_bytes) // 16, 1024)  # float32: a quarter of L2
        buf = torch.ones(numel, dtype=torch.float32, device=self.device)
        cold: list[float] = []
        warm: list[float] = []
        with _no_grad():
            buf.sum()
            _cuda_synchronize()
            for _ in range(repeats):
                self._flush()
                _cuda_synchronize()
                cold.append(self._event_ms(buf.sum))
                warm.append(self._event_ms(buf.sum))
        del buf
        cold_ms, warm_ms = quantile(sorted(cold), 0.5), quantile(sorted(warm), 0.5)
        return {"cold_ms": round(cold_ms, 5), "warm_ms": round(warm_ms, 5), "read_bytes": numel * 4,
                "ratio": round(cold_ms / warm_ms, 3) if warm_ms > 0 else None,
                "evicts": flush_evicts(cold_ms, warm_ms), "rule": rule}


def flush_evicts(cold_ms: float, warm_ms: float) -> bool:
    """The flush rule (see check_flush)."""
    return warm_ms > 0 and cold_ms >= FLUSH_EVICTS_RATIO * warm_ms


class KeptOutputs:
    """The outputs of the last `keep` of `calls` measured calls, copied into slots allocated
    up front (outside the timed region; the server has them verified after the loop). The
    candidate's loop and the reference's calibration loop use this one class, so the copies the
    server's clock sees cost the same on both sides."""

    def __init__(self, shapes: list[tuple[tuple[int, ...], Any]], keep: int, calls: int, device: Any):
        self.slots = [[torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes]
                      for _ in range(max(keep, 0))]
        self.first = calls - len(self.slots)  # the call index kept in slot 0
        self.index = [-1] * len(self.slots)  # the call each slot holds

    def __call__(self, call: int, outputs: list[Any]) -> None:
        if call < self.first:
            return
        slot = call - self.first
        for target, value in zip(self.slots[slot], outputs):
            target.copy_(value)
        self.index[slot] = call


class FixedLoop:
    """The timed loop of the candidate (and, with an empty model, its calibration in the
    reference process): exactly `warmup_calls + calls` calls, a fresh input set each, and
    after each measured call `after_call(index, output)` outside the timed region (the harness
    copies the output aside there so the server can have it verified).

    The server clocks this whole loop from the outside and subtracts the calibration loop's
    time, so the per-call times this loop reports are claims it can check."""

    def __init__(self, timer: "Timer", marks: Any = None):
        self.timer = timer
        self.marks = marks  # trace/marks.Marks: each call between the kernel trace's markers (issue 55)

    def _marker(self, phase: int, index: int) -> Callable[[bool], Any] | None:
        marks = self.marks
        if marks is None or not marks.available:
            return None
        stream = _current_stream_handle()
        return lambda end: marks.mark(stream=stream, phase=phase, index=index, end=end)

    def run(self, fn: Callable[..., Any], input_sets: Any, warmup_calls: int, calls: int,
            after_call: Callable[[int, Any], None] | None = None, phase: int = 3,
            first_index: int = 0) -> TimingReport:
        """`phase`, `first_index`: the trace's markers of the measured calls (warm-ups: phase 4),
        numbered from `first_index` (a segment continues the loop's numbering)."""
        readings: list[tuple[float, float]] = []
        timer = self.timer
        with _no_grad(), _no_collection():
            for index in range(warmup_calls + calls):
                inputs = input_sets[index]
                mark = self._marker(4, first_index + index) if index < warmup_calls else \
                    self._marker(phase, first_index + index - warmup_calls)
                # the first call comes after a pause (the server's check between segments): its
                # launch gets the longer cover (FIRST_COVER_FACTOR), in the calibration's loop too
                event, host, out = timer._one_out(fn, inputs, first=index == 0, mark=mark)
                if index < warmup_calls:
                    continue
                readings.append((event, host))
                if after_call is not None:
                    after_call(index - warmup_calls, out)
                del out
        samples = timer.samples(readings)
        ordered = sorted(samples)
        timing = Timing(median_ms=quantile(ordered, 0.5), q1_ms=quantile(ordered, 0.25),
                        q3_ms=quantile(ordered, 0.75), min_ms=ordered[0] if ordered else float("nan"),
                        reps=len(ordered), meaningful=timer.cuda,
                        note="" if timer.cuda else "CPU wall clock (Triton interpreter): not meaningful")
        return TimingReport(timing=timing, escaped_ms=timer.escaped_ms(readings), samples_ms=samples)


def phase_marker(marks: Marks | None, phase: int | None) -> Callable[[int], Callable[[bool], Any]] | None:
    """For Timer.measure: call i's markers of `phase` on the current stream (trace/marks.py); None
    where no tracer is attached or there is no phase."""
    if marks is None or not marks.available or phase is None:
        return None
    stream = _current_stream_handle()
    return lambda index: (lambda end: marks.mark(stream=stream, phase=phase, index=index, end=end))


def _current_stream_handle() -> int:
    """The CUstream handle of torch's current stream (the markers go where the call's events go)."""
    return int(_current_stream().cuda_stream)


def escaped_work_is_significant(report: TimingReport) -> bool:
    """True when the host clock saw clearly more than the stream's events did: work ran
    outside the timed stream (side streams, threads) or after the call returned."""
    return report.escaped_ms > max(0.05, 0.25 * report.timing.median_ms)

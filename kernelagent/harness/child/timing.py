"""The timer, shared by the candidate and the baselines so that both are measured alike.

This module is imported by the harness server before any candidate exists, and binds the
clock functions it uses at that moment: a candidate that later patches `time.perf_counter`,
`torch.cuda.synchronize` or `torch.cuda.Event` does not change what this timer calls.

Each timed iteration, on CUDA:
    flush L2 (write a buffer larger than L2)  -> device-wide synchronize
    host clock t0 -> start event -> fn(*inputs) -> end event -> device-wide synchronize -> t1
The iteration's time is max(event time, host time - host overhead). The event time is
precise for work on the current stream; the host time, taken after a device-wide
synchronize, includes work that the candidate pushed to other streams or left running.
When the host time is the larger by a clear margin, the result is flagged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernelagent.harness.result import Timing
from kernelagent.harness.stats import quantile

# Bound now, before any candidate code runs in this process.
_perf_counter = time.perf_counter
_cuda_synchronize = torch.cuda.synchronize
_CudaEvent = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_no_grad = torch.no_grad


@dataclass
class TimingReport:
    timing: Timing
    escaped_ms: float = 0.0  # median host time beyond the event time, overhead removed
    samples_ms: list[float] = field(default_factory=list)


class Timer:
    def __init__(self, device: torch.device, flush_bytes: int, flush_l2: bool = True):
        self.device = device
        self.cuda = device.type == "cuda"
        self.flush_buffer = None
        if self.cuda and flush_l2:
            self.flush_buffer = torch.empty(max(flush_bytes // 4, 1), dtype=torch.int32, device=device)
        self.overhead_ms = 0.0
        if self.cuda:
            self.overhead_ms = self._calibrate()

    def _flush(self) -> None:
        if self.flush_buffer is not None:
            self.flush_buffer.zero_()

    def _one(self, fn: Callable[..., Any], inputs: list[Any]) -> tuple[float, float]:
        """(event ms, host ms) of one call."""
        event, host, _out = self._one_out(fn, inputs)
        return event, host

    def _one_out(self, fn: Callable[..., Any], inputs: list[Any]) -> tuple[float, float, Any]:
        """(event ms, host ms, output) of one call."""
        if not self.cuda:
            t0 = _perf_counter()
            out = fn(*inputs)
            host = (_perf_counter() - t0) * 1e3
            return host, host, out
        self._flush()
        _cuda_synchronize()
        start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
        t0 = _perf_counter()
        _event_record(start)
        out = fn(*inputs)
        _event_record(end)
        _cuda_synchronize()
        host = (_perf_counter() - t0) * 1e3
        return _event_elapsed(start, end), host, out

    def _calibrate(self) -> float:
        """Host time of an empty timed iteration (clock, two events, one synchronize)."""
        samples = []
        for _ in range(20):
            event, host = self._one(lambda: None, [])
            samples.append(host - event)
        samples.sort()
        return max(quantile(samples, 0.5), 0.0)

    def measure(self, fn: Callable[..., Any], input_sets: list[list[Any]], warmup_ms: float,
                target_ms: float, min_reps: int, max_reps: int, budget_s: float) -> TimingReport:
        """Warm up, choose the repetition count from the warm-up's speed, then measure,
        cycling through `input_sets`. Stops early (with fewer reps) past `budget_s`.

        One running index covers the warm-up and the measured calls, so a sequence that
        hands out a new set per index (inputs.FreshInputs) never repeats one: a warm-up
        call cannot prime an output cache for the measured calls."""
        started = _perf_counter()
        with _no_grad():
            calls = 0
            warm: list[float] = []
            warm_started = _perf_counter()
            while len(warm) < 2 or ((_perf_counter() - warm_started) * 1e3 < warmup_ms and len(warm) < 100):
                event, host = self._one(fn, input_sets[calls % len(input_sets)])
                calls += 1
                warm.append(max(event, host - self.overhead_ms))
                if _perf_counter() - started > budget_s / 2:
                    break
            estimate = max(sorted(warm)[len(warm) // 2], 1e-4)
            reps = int(min(max(math.ceil(target_ms / estimate), min_reps), max_reps))
            samples: list[float] = []
            gaps: list[float] = []
            for _ in range(reps):
                event, host = self._one(fn, input_sets[calls % len(input_sets)])
                calls += 1
                gap = host - self.overhead_ms - event
                samples.append(max(event, host - self.overhead_ms))
                gaps.append(gap)
                if _perf_counter() - started > budget_s and len(samples) >= 3:
                    break
        ordered = sorted(samples)
        timing = Timing(
            median_ms=quantile(ordered, 0.5),
            q1_ms=quantile(ordered, 0.25),
            q3_ms=quantile(ordered, 0.75),
            min_ms=ordered[0],
            reps=len(ordered),
            meaningful=self.cuda,
            note="" if self.cuda else "CPU wall clock (Triton interpreter): not meaningful",
        )
        escaped = quantile(sorted(gaps), 0.5) if self.cuda else 0.0
        return TimingReport(timing=timing, escaped_ms=max(escaped, 0.0), samples_ms=samples)


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

    def __init__(self, timer: "Timer"):
        self.timer = timer

    def run(self, fn: Callable[..., Any], input_sets: Any, warmup_calls: int, calls: int,
            after_call: Callable[[int, Any], None] | None = None) -> TimingReport:
        samples: list[float] = []
        gaps: list[float] = []
        timer = self.timer
        with _no_grad():
            for index in range(warmup_calls + calls):
                inputs = input_sets[index]
                event, host, out = timer._one_out(fn, inputs)
                if index < warmup_calls:
                    continue
                samples.append(max(event, host - timer.overhead_ms))
                gaps.append(host - timer.overhead_ms - event)
                if after_call is not None:
                    after_call(index - warmup_calls, out)
                del out
        ordered = sorted(samples)
        timing = Timing(median_ms=quantile(ordered, 0.5), q1_ms=quantile(ordered, 0.25),
                        q3_ms=quantile(ordered, 0.75), min_ms=ordered[0] if ordered else float("nan"),
                        reps=len(ordered), meaningful=timer.cuda,
                        note="" if timer.cuda else "CPU wall clock (Triton interpreter): not meaningful")
        escaped = quantile(sorted(gaps), 0.5) if timer.cuda and gaps else 0.0
        return TimingReport(timing=timing, escaped_ms=max(escaped, 0.0), samples_ms=samples)


def escaped_work_is_significant(report: TimingReport) -> bool:
    """True when the host clock saw clearly more than the stream's events did: work ran
    outside the timed stream (side streams, threads) or after the call returned."""
    return report.escaped_ms > max(0.05, 0.25 * report.timing.median_ms)

"""The two clocks of a result (issue 58, docs/concepts/timing.md "Two clocks"): the candidate's
device time per call (its kernel trace) beside its wall time per call (the checked median) and
the host share between them, and the speedups on the device clock where the baselines' device
times were traced too. Pure functions of the result; the wall-clock speedups stay as they are."""

from __future__ import annotations

from kernelagent.harness.result import CallClock, EvalResult, ms_or_none


def apply_clocks(result: EvalResult) -> None:
    """`result.per_call` from the trace's device time per call (kernel_evidence["trace_ms_per_call"],
    set by results.apply_trace) and the candidate's checked median; then `speedups_device`: each
    baseline's device time per call (Timing.device_ms) over the candidate's. Nothing where either
    figure is missing or not a finite time (validated again here: the facts came over a pipe)."""
    candidate = result.timings.get("candidate")
    device = (result.kernel_evidence or {}).get("trace_ms_per_call")
    if candidate is None or not candidate.meaningful:
        return
    result.per_call = CallClock.of(device_ms=device, wall_ms=candidate.median_ms, source="trace")
    result.speedups_device = device_speedups(result)


def device_speedups(result: EvalResult) -> dict[str, float]:
    """baseline name -> its device ms per call / the candidate's, on the device clock alone. None
    of them where the candidate's device time is zero or unknown, or its time is one the hardware
    cannot deliver (`impossible-speed`, as for the wall-clock speedups)."""
    clock = result.per_call
    if clock is None or clock.device_ms <= 0 or any(f.kind == "impossible-speed" for f in result.flags):
        return {}
    speedups = {}
    for name, timing in result.timings.items():
        base = ms_or_none(timing.device_ms, positive=True) if name != "candidate" else None
        if base is not None:
            speedups[name] = base / clock.device_ms
    return speedups

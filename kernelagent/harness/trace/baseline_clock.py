"""The baselines on the device clock (issue 58): each baseline's median device time per timed
call, read from the reference process's own kernel trace. Pure; the server's side is
server/trace_stage.baseline_clock.

The reference process (ours, trusted) times each baseline runner with its timed calls between
marker kernels of phase marks.BASELINE + r (r: the runner's place in marks.runner_names, the
order the server knows from the modes it sent), numbered 0, 1, ... per runner, then flushes the
tracer with mark marks.BASELINE_FLUSH before it answers `baseline_timings`. The reference keeps
running (and tracing) after that, so only the records up to that flush are read. Its pipe is its
own (the candidate's jail closed every descriptor but its own), yet what is decoded is still
validated: the decoder's forms, seq without gaps, no dropped records, markers paired in order on
one stream. A figure is a finite, positive number of milliseconds, or it is not there.
"""

from __future__ import annotations

import math
import statistics

from kernelagent.harness.trace import calls as calls_mod
from kernelagent.harness.trace.marks import BASELINE, BASELINE_FLUSH, BASELINE_RUNNERS
from kernelagent.harness.trace.records import Dropped, Flush, Hello, Kernel, Trace, TraceDecodeError, decode

END_OF_BASELINES = b'"t":"flush","mark":%d,' % BASELINE_FLUSH  # the flush record's bytes, as the tracer writes them


def until_flush(data: bytes) -> bytes | None:
    """The trace up to and including the line of the baselines' flush, None before it came."""
    at = data.find(END_OF_BASELINES)
    if at < 0:
        return None
    end = data.find(b"\n", at)
    return None if end < 0 else data[:end + 1]


def device_ms(data: bytes, names: list[str]) -> tuple[dict[str, float], str]:
    """({baseline name: median device ms per timed call}, '' or why none could be read).
    `names`: marks.runner_names of the modes the server sent."""
    head = until_flush(data)
    if head is None:
        return {}, "the reference's trace has no flush after its baselines"
    try:
        trace = decode(head)
    except TraceDecodeError as exc:
        return {}, f"the reference's trace does not decode: {exc.reason}"
    wrong = _integrity(trace)
    if wrong:
        return {}, wrong
    calls, wrong = _pair(trace, len(names))
    if wrong:
        return {}, wrong
    markers = [k for k in trace.markers if k.grid[1] >= BASELINE]
    ctx, dev = (markers[0].ctx, markers[0].dev) if markers else (None, None)
    # the work of the markers' context and device (the runners' own), each in the call that holds its start
    calls_mod.place([c for _, c in calls], [r for r in calls_mod.work_records(trace) if r.ctx == ctx and r.dev == dev])
    names_rule = calls_mod.Names(frozenset())
    per_runner: dict[str, list[int]] = {}
    for runner, call in calls:
        per_runner.setdefault(names[runner], []).append(calls_mod.call_facts(call, names_rule).kernel_ns)
    found = {}
    for name, kernel_ns in per_runner.items():
        ms = statistics.median(kernel_ns) / 1e6
        if math.isfinite(ms) and ms > 0:
            found[name] = ms
    return found, ""


def _integrity(trace: Trace) -> str:
    records = trace.records
    if not records or not isinstance(records[0], Hello):
        return "the reference's trace has no hello"
    for i, r in enumerate(records):
        if r.seq != i:
            return f"the reference's trace has record {i} with seq {r.seq}"
        if isinstance(r, Dropped) and r.n:
            return f"the reference's tracer dropped {r.n} record(s)"
        if hasattr(r, "end") and r.end < r.start:
            return f"the reference's trace has record {i} ending before it starts"
    if not any(isinstance(r, Flush) and r.mark == BASELINE_FLUSH for r in records):
        return "the reference's trace has no flush after its baselines"
    return ""


def _pair(trace: Trace, runners: int) -> tuple[list[tuple[int, calls_mod.Call]], str]:
    """The baselines' timed calls, as (runner, call) in device order; markers of the harness's
    other phases (none are sent in the reference today) are left alone."""
    phases = range(BASELINE, BASELINE + min(runners, BASELINE_RUNNERS))
    markers = sorted((k for k in trace.markers if k.grid[1] in phases), key=lambda k: (k.start, k.seq))
    calls: list[tuple[int, calls_mod.Call]] = []
    open_: Kernel | None = None
    next_index: dict[int, int] = {}
    for k in markers:
        if k.block != (1, 1, 1) or k.grid[2] not in (calls_mod.BEGIN, calls_mod.END):
            return [], f"the reference's trace has a marker with grid {list(k.grid)}, not one of ours"
        runner, index = k.grid[1] - BASELINE, k.grid[0] - 1
        if k.grid[2] == calls_mod.BEGIN:
            if open_ is not None or index != next_index.get(runner, 0):
                return [], f"the reference's baseline markers are out of order (runner {runner}, call {index})"
            next_index[runner] = index + 1
            open_ = k
            continue
        if open_ is None or open_.grid[:2] != k.grid[:2] or open_.stream != k.stream or open_.ctx != k.ctx:
            return [], f"the reference's baseline markers do not pair (runner {runner}, call {index})"
        calls.append((runner, calls_mod.Call(f"baseline:{runner}", index, k.stream, open_.start, k.start)))
        open_ = None
    if open_ is not None:
        return [], "a baseline call of the reference has no end marker"
    return calls, ""

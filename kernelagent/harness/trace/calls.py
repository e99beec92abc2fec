"""The calls of a trace (issue 55): its marker kernels paired into calls, and each record of
device work placed in the call whose span holds its start. Pure; rules.py judges what this finds.

A call's span runs from its begin marker's start to its end marker's start, on the device's clock:
the harness queues the begin marker just before the call's start event (after the L2 flush and
the launch cover's spin, child/timing.py) and the end marker just after its end event, on the
same stream as the call, so everything the call queued on that stream runs inside the span, and
the harness's own flush, spin, input generation and output copies run outside every span.

Marker kernels (records.MARKER_NAME, block (1,1,1)) carry grid (index+1, phase, 1) before a call
and (index+1, phase, 2) after it. `pair_markers` walks them in device order and says what is
wrong with them in one line (the rules' `trace-missing`): a shape outside the contract, an end
without its begin, a begin without its end, a phase the server did not run, a count other than
the server ordered, an index out of order.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Union

from kernelagent.harness.cuda_source import is_glue_kernel, is_own_kernel
from kernelagent.harness.trace.records import Kernel, Memcpy, Memset, Trace

PHASES = {1: "first", 2: "check", 3: "timed", 4: "warmup"}
# Phases 16..31 (marks.BASELINE + r) are the reference's baselines' timed calls (issue 58), read
# by baseline_clock.py from the reference's own trace; never one of a candidate's phases (a
# candidate's marker of one is "not one of ours": trace-missing).
BEGIN, END = 1, 2

Work = Union[Kernel, Memcpy, Memset]


@dataclass(frozen=True)
class Expected:
    """What the SERVER knows of the process it traced, never what the process said.

    own_names: the candidate's own kernel names, read from its source (cuda_source.static_own_names);
    checks: check calls ordered (phase `check`, indices 0..checks-1 in order);
    timed: timed calls ordered, all segments together (phase `timed`; each segment's indices
    count 0, 1, ... again); warmups: warm-up calls (phase `warmup`), None where not known;
    median_ms: the timed median per call the server checked, None where there is none;
    phases: the phases the server ran (markers of any other phase are not ours);
    main_checks: the check indices on the problem's main inputs (their own launches are the floor
    of a timed call's); baseline: the trace is of the reference's process (trusted): only the
    trace's own integrity is judged, never the own-kernel rules."""

    own_names: frozenset[str] = frozenset()
    checks: int = 0
    timed: int = 0
    warmups: int | None = None
    median_ms: float | None = None
    phases: frozenset[str] = frozenset(PHASES.values())
    main_checks: tuple[int, ...] = (0,)
    baseline: bool = False


@dataclass
class Call:
    """One call between its markers. lo/hi: the span, from the begin marker's start (a kernel
    launched with programmatic dependent launch may start before the marker's end is stamped)
    to the end marker's start (which waits for everything before it on the stream)."""

    phase: str
    index: int
    stream: int
    lo: int
    hi: int
    work: list[Work] = field(default_factory=list)


@dataclass(frozen=True)
class CallFacts:
    """What one call ran: device ns by kind (own kernels, library kernels that are work, glue:
    copies and fills by name, memcpy, memset), the union of its work's intervals in the span
    (busy), the sum of its kernels' durations, its streams and own launches."""

    phase: str
    index: int
    span_ns: int
    own_ns: int
    library_ns: int
    glue_ns: int
    busy_ns: int
    kernel_ns: int
    streams: tuple[int, ...]
    own_launches: tuple[tuple[str, int], ...]
    library_launches: int
    records: int  # records of device work in the span (kernels, copies, fills), markers not counted


def is_marker_shape(k: Kernel) -> bool:
    return k.block == (1, 1, 1) and k.grid[0] >= 1 and k.grid[1] in PHASES and k.grid[2] in (BEGIN, END)


def pair_markers(trace: Trace, expected: Expected) -> tuple[list[Call], str]:
    """The calls, in device order, and what is wrong with the markers ('' when nothing)."""
    markers = sorted(trace.markers, key=lambda k: (k.start, k.seq))
    calls: list[Call] = []
    open_: Kernel | None = None
    last_index: dict[str, int] = {}
    for k in markers:
        if not is_marker_shape(k):
            return calls, f"a marker kernel with grid {list(k.grid)} and block {list(k.block)}, not one of ours"
        phase, index, side = PHASES[k.grid[1]], k.grid[0] - 1, k.grid[2]
        if phase not in expected.phases:
            return calls, f"a marker of phase '{phase}', which the server did not run"
        if side == BEGIN:
            if open_ is not None:
                return calls, f"the {PHASES[open_.grid[1]]} call {open_.grid[0] - 1} has no end marker before the next call"
            previous = last_index.get(phase)
            if phase in ("first", "check"):
                wanted = 0 if previous is None else previous + 1
                if index != wanted:
                    return calls, f"the {phase} call {index} came where call {wanted} was due"
            elif index not in (0, (previous if previous is not None else -1) + 1):
                # the timed loop's index counts from 0 again in each segment
                return calls, f"the {phase} call {index} came after call {previous}"
            last_index[phase] = index
            open_ = k
            continue
        if open_ is None or open_.grid[:2] != k.grid[:2]:
            return calls, f"an end marker of the {phase} call {index} without its begin marker"
        if open_.stream != k.stream or open_.ctx != k.ctx:
            return calls, f"the {phase} call {index}'s markers ran on different streams"
        calls.append(Call(phase, index, k.stream, open_.start, k.start))
        open_ = None
    if open_ is not None:
        return calls, f"the {PHASES[open_.grid[1]]} call {open_.grid[0] - 1} has no end marker"
    counts = Counter(c.phase for c in calls)
    wanted = {"first": 1 if "first" in expected.phases else 0,
              "check": expected.checks if "check" in expected.phases else 0,
              "timed": expected.timed if "timed" in expected.phases else 0,
              "warmup": (expected.warmups if "warmup" in expected.phases else 0)}
    for phase, want in wanted.items():
        if want is not None and counts[phase] != want:
            return calls, f"{counts[phase]} {phase} call(s) between markers, where the server ran {want}"
    return calls, ""


def work_records(trace: Trace) -> list[Work]:
    """Every record of device work but the markers."""
    return [r for r in trace.records if isinstance(r, (Memcpy, Memset)) or (isinstance(r, Kernel) and not r.is_marker)]


def place(calls: list[Call], work: list[Work]) -> list[Work]:
    """Each work record into the call whose span holds its start (spans never overlap: the
    markers ran in order on one stream); returns the records outside every span."""
    ordered = sorted(calls, key=lambda c: c.lo)
    starts = [c.lo for c in ordered]
    outside = []
    for r in work:
        i = bisect.bisect_right(starts, r.start) - 1
        if i >= 0 and r.start < ordered[i].hi:
            ordered[i].work.append(r)
        else:
            outside.append(r)
    return outside


def _union(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for lo, hi in sorted(intervals):
        if reach is None or lo > reach:
            total += hi - lo
            reach = hi
        elif hi > reach:
            total += hi - reach
            reach = hi
    return total


class Names:
    """cuda_source's name rules (is_own_kernel, is_glue_kernel) once per distinct kernel name:
    a trace repeats its names thousands of times, and the rules parse each one."""

    def __init__(self, own_names: frozenset[str] | set[str]):
        self.own_names = set(own_names)
        self._own: dict[str, bool] = {}
        self._glue: dict[str, bool] = {}

    def own(self, name: str) -> bool:
        found = self._own.get(name)
        if found is None:
            found = self._own[name] = is_own_kernel(name, self.own_names)
        return found

    def glue(self, name: str) -> bool:
        found = self._glue.get(name)
        if found is None:
            found = self._glue[name] = is_glue_kernel(name)
        return found


def call_facts(call: Call, names: Names) -> CallFacts:
    own = library = glue = kernel_ns = library_launches = 0
    launches: Counter[str] = Counter()
    for r in call.work:
        ns = r.end - r.start
        if isinstance(r, Kernel):
            kernel_ns += ns
            if names.own(r.name):
                own += ns
                launches[r.name] += 1
            elif names.glue(r.name):
                glue += ns
            else:
                library += ns
                library_launches += 1
        else:
            glue += ns
    busy = _union([(max(r.start, call.lo), min(r.end, call.hi)) for r in call.work if min(r.end, call.hi) > r.start])
    return CallFacts(phase=call.phase, index=call.index, span_ns=max(call.hi - call.lo, 0), own_ns=own,
                     library_ns=library, glue_ns=glue, busy_ns=busy, kernel_ns=kernel_ns,
                     streams=tuple(sorted({r.stream for r in call.work})),
                     own_launches=tuple(sorted(launches.items())), library_launches=library_launches,
                     records=len(call.work))

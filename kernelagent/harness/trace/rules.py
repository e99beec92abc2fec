"""The rules of the kernel trace (issue 55): `judge(trace, expected) -> TraceVerdict`, pure.

The trace is what CUPTI saw the traced process run, read from a channel that process could also
write into; `expected` is what the server itself ordered (calls.Expected). The rules, in the
order they are tried (TRACE_SPEC.md "Rules"; thresholds below, each with its reason):

Integrity (a trace that fails one of these decides nothing else):
- `trace-forged` (reject): seq is not 0, 1, 2, ... in arrival order; a second hello; two
  kernels outside a CUDA graph with one correlation id (kernels of one graph launch share theirs);
  a record that ends before it starts; a record after the final flush; bytes the decoder refuses.
- `trace-incomplete` (info: not the candidate's verdict): the tracer dropped records, or the
  trace was past the reader's caps. The evidence falls back to Nsight Compute and says why
  (`TraceVerdict.incomplete`); nothing else is judged on a trace with holes.
- `trace-missing` (reject): no hello, no final flush, a trace cut short mid-record, or markers
  absent, duplicated, out of order, of a phase the server did not run (calls.pair_markers).
- `other-context` (reject): work in a CUDA context or on a device other than the markers'.

The candidate's timed calls (not judged for a baseline: the reference's process is ours):
- `no-custom-kernel` (reject): none of its own kernels ran in any timed call. `hidden-work`
  (reject): its own kernels took under OWN_SHARE of the timed calls' device time that is not
  glue (copies and fills by their names, memcpy and memset records): caller/kernel_evidence's
  rules, over the calls that were timed.
- `idle-call` (reject): a timed call ran no device work at all while the checks ran kernels
  (one launch serving several timed calls, or the work done by a process the tracer cannot see).
- `launch-mismatch` (reject): a timed call's own launches (a multiset of names) differ from
  what most timed calls launched, or launch a name fewer times than every main check did. The
  first call (compile, autotune) and the warm-ups are never compared; a check that autotuned
  only raises the floor where every main check did, so the floor is the least over them.
- `outside-interval` (reject): work that starts in a timed call's span and ends after it
  (left running past the call), or, between the timed loop's first and last marker, an own
  kernel outside every call, or any work on a stream other than the loop markers' outside every
  call. A record may end up to LATE_SLACK_NS after its call's end marker started (stamping).
- `untraced-work` (reject when gross, review otherwise): the device's traced busy time in the
  median timed call is far below the server's median (CUPTI switched off around work).
- `clock-mismatch` (review): the traced kernel time of the median call is over
  CLOCK_FACTOR x median + CLOCK_SLACK_NS (kernel_evidence's rule, per traced call).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from kernelagent.harness.cuda_source import short_name
from kernelagent.harness.result import SEVERITY
from kernelagent.harness.trace import calls as calls_mod
from kernelagent.harness.trace.calls import Call, CallFacts, Expected
from kernelagent.harness.trace.records import (CUT_SHORT, OVERFLOW, Dropped, Flush, Hello, Kernel, Trace,
                                               TraceDecodeError, decode)

__all__ = ["Expected", "TraceFacts", "TraceVerdict", "judge", "judge_bytes", "decode_failure"]

# hidden-work: the candidate's own kernels must take at least this share of the timed calls'
# device time that is not glue (the same bar as caller/kernel_evidence and min_own_device_share).
OWN_SHARE = 0.5
# untraced-work. A call's traced busy time (the union of its records' intervals in its span)
# sits near its event time when the launch cover did its work (child/timing.py: the device runs
# the call's kernels back to back, queued behind a 400 us spin). What an honest call may still
# leave untraced: the gaps between kernels (~1-2 us each on an H100/H200), the empty event pair
# the median already had taken off, and, where its host launches outlast the cover, launch gaps.
# So the allowance is a fixed slack plus a gap per launch, and only a busy time under a share of
# the median counts at all: a 3 us kernel whose median reads 8 us is never flagged, nor a call
# of twenty launches whose median is host-bound by 200 us.
UNTRACED_SLACK_NS = 10_000
UNTRACED_PER_LAUNCH_NS = 10_000
UNTRACED_SHARE = 0.5  # review below this share of the median (and past the allowance)
UNTRACED_GROSS_SHARE = 0.2  # reject below this share, past the allowance and GROSS_NS more
UNTRACED_GROSS_NS = 100_000
# outside-interval: a record may end this long after its call's end marker started before it
# counts as running past the call (CUPTI stamps both on one clock; on one stream the marker waits
# for the work, so only stamping jitter could show an honest overlap at all).
LATE_SLACK_NS = 1_000
# clock-mismatch: kernel_evidence's SLOWER_FACTOR and SLOWER_SLACK_MS, per traced call.
CLOCK_FACTOR = 1.5
CLOCK_SLACK_NS = 5_000


@dataclass(frozen=True)
class TraceFacts:
    """What the trace showed, whatever the flags: `calls` are the timed calls' facts, in device
    order; kernel_ms_per_call is the median timed call's summed kernel time (the trace's device
    clock for issue 58), busy_ms_per_call its union of busy intervals."""

    records: int = 0
    kernels: int = 0
    dropped: int = 0
    marker_ctx: int | None = None
    marker_stream: int | None = None
    calls: tuple[CallFacts, ...] = ()
    kernel_ms_per_call: float | None = None
    busy_ms_per_call: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TraceVerdict:
    """flags: {"kind", "severity", "message"} as kernel_evidence's; incomplete: why the trace
    cannot decide (the evidence then falls back to Nsight Compute), '' when it can."""

    flags: tuple[dict[str, str], ...] = ()
    facts: TraceFacts = field(default_factory=TraceFacts)
    incomplete: str = ""

    @property
    def kinds(self) -> list[str]:
        return [f["kind"] for f in self.flags]

    @property
    def rejected(self) -> bool:
        return any(f["severity"] == "reject" for f in self.flags)


def _flag(kind: str, message: str, severity: str | None = None) -> dict[str, str]:
    return {"kind": kind, "severity": severity or SEVERITY[kind], "message": message}


def decode_failure(error: TraceDecodeError) -> TraceVerdict:
    """The verdict on bytes the decoder refused: cut short -> trace-missing, past the caps ->
    trace-incomplete (fall back), anything else -> trace-forged."""
    if error.kind == CUT_SHORT:
        return TraceVerdict((_flag("trace-missing", f"the kernel trace was cut short: {error.reason}"),))
    if error.kind == OVERFLOW:
        return TraceVerdict((_flag("trace-incomplete", f"the kernel trace is incomplete: {error.reason}"),),
                            incomplete=error.reason)
    return TraceVerdict((_flag("trace-forged", f"the kernel trace holds a record that is not the tracer's: "
                                               f"{error.reason}"),))


def judge_bytes(data: bytes, expected: Expected) -> TraceVerdict:
    """decode, then judge; a decode failure is its own verdict (decode_failure)."""
    try:
        trace = decode(data)
    except TraceDecodeError as exc:
        return decode_failure(exc)
    return judge(trace, expected)


def _forged(trace: Trace) -> str:
    seen_corr: dict[int, int] = {}
    final_at: int | None = None
    for i, r in enumerate(trace.records):
        if r.seq != i:
            return f"record {i} has seq {r.seq} (the tracer numbers its records 0, 1, 2, ... without gaps)"
        if final_at is not None:
            return f"record {i} came after the final flush (record {final_at})"
        if isinstance(r, Hello) and i != 0:
            return f"a second hello at record {i}"
        if isinstance(r, Flush) and r.final:
            final_at = i
        if hasattr(r, "end") and r.end < r.start:
            return f"record {i} ends ({r.end}) before it starts ({r.start})"
        if isinstance(r, Kernel):
            if r.corr in seen_corr and (r.graph == 0 or seen_corr[r.corr] != r.graph):
                return f"two kernels with correlation id {r.corr} outside one CUDA graph"
            seen_corr[r.corr] = r.graph
    return ""


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def judge(trace: Trace, expected: Expected) -> TraceVerdict:
    kernels = trace.kernels
    dropped = sum(r.n for r in trace.of(Dropped))
    base = TraceFacts(records=len(trace.records), kernels=len(kernels), dropped=dropped)
    if not _started(trace):
        return TraceVerdict((_flag("trace-missing", "the kernel trace has no hello: the tracer never ran in the "
                                                    "process, or its channel was closed"),), base)
    forged = _forged(trace)
    if forged:
        return TraceVerdict((_flag("trace-forged", f"the kernel trace was written into by someone else: {forged}"),),
                            base)
    if _dropped(dropped):
        why = f"the tracer dropped {dropped} record(s)"
        return TraceVerdict((_flag("trace-incomplete", f"the kernel trace is incomplete: {why}"),), base, why)
    if not _finished(trace):
        return TraceVerdict((_flag("trace-missing", "the kernel trace has no final flush: the tracer was switched "
                                                    "off or cut short"),), base)
    calls, wrong = calls_mod.pair_markers(trace, expected)
    if wrong:
        return TraceVerdict((_flag("trace-missing", f"the kernel trace's markers are wrong: {wrong}"),), base)
    markers = trace.markers
    ctx, dev = (markers[0].ctx, markers[0].dev) if markers else (None, None)
    stream = markers[0].stream if markers else None
    work = calls_mod.work_records(trace)
    flags = _other_context(markers, work)
    outside = calls_mod.place(calls, [r for r in work if r.ctx == ctx and r.dev == dev])
    timed = [c for c in calls if c.phase == "timed"]
    names = calls_mod.Names(expected.own_names)
    facts = [calls_mod.call_facts(c, names) for c in timed]
    base = TraceFacts(records=len(trace.records), kernels=len(kernels), dropped=0, marker_ctx=ctx,
                      marker_stream=stream, calls=tuple(facts),
                      kernel_ms_per_call=_ms(_median([f.kernel_ns for f in facts])),
                      busy_ms_per_call=_ms(_median([f.busy_ns for f in facts])))
    if not expected.baseline and timed:
        checks = [c for c in calls if c.phase == "check"]
        flags += _no_custom(facts, expected)
        flags += _hidden(facts)
        flags += _idle(facts, checks)
        flags += _launches(facts, checks, expected, names)
        flags += _intervals(timed, [c for c in calls if c.phase in ("timed", "warmup")], outside, names)
        flags += _untraced(facts, expected)
        flags += _clock(facts, expected)
    return TraceVerdict(tuple(flags), base)


def _started(trace: Trace) -> bool:
    return bool(trace.records) and isinstance(trace.records[0], Hello)


def _dropped(dropped: int) -> bool:
    return dropped > 0


def _finished(trace: Trace) -> bool:
    return any(isinstance(r, Flush) and r.final for r in trace.records)


def _other_context(markers: list[Kernel], work: list[Any]) -> list[dict[str, str]]:
    if not markers:
        return []
    ctx, dev = markers[0].ctx, markers[0].dev
    strange = [r for r in [*markers, *work] if r.ctx != ctx or r.dev != dev]
    if not strange:
        return []
    r = strange[0]
    return [_flag("other-context", f"{len(strange)} record(s) of device work ran in another CUDA context or on "
                                   f"another device than the harness's markers (first: {_what(r)} in context "
                                   f"{r.ctx} on device {r.dev}, the markers' {ctx} on {dev})")]


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _what(r: Any) -> str:
    return f"kernel {short_name(r.name, 60)}" if isinstance(r, Kernel) else type(r).__name__.lower()


def _no_custom(facts: list[CallFacts], expected: Expected) -> list[dict[str, str]]:
    if any(f.own_launches for f in facts):
        return []
    library = sum(f.library_ns for f in facts)
    names = ", ".join(sorted(expected.own_names)) or "none found in its source"
    return [_flag("no-custom-kernel", f"the kernel trace saw none of the candidate's own kernels ({names}) run in "
                                      f"its {len(facts)} timed calls (library kernels took {library / 1e3:.1f} us): "
                                      "the heavy work must run in the candidate's own kernels")]


def _hidden(facts: list[CallFacts]) -> list[dict[str, str]]:
    own = sum(f.own_ns for f in facts)
    library = sum(f.library_ns for f in facts)
    if not any(f.own_launches for f in facts) or own >= OWN_SHARE * (own + library):
        return []
    return [_flag("hidden-work", f"in the timed calls the candidate's own kernels took {own / 1e3:.1f} us and "
                                 f"library kernels other than copies and fills {library / 1e3:.1f} us: the heavy "
                                 "work must run in the candidate's own kernels")]


def _idle(facts: list[CallFacts], checks: list[Call]) -> list[dict[str, str]]:
    idle = [f for f in facts if f.records == 0]
    if not idle or not any(isinstance(r, Kernel) for c in checks for r in c.work):
        return []
    return [_flag("idle-call", f"{len(idle)} of {len(facts)} timed calls ran no device work at all (first: call "
                               f"{idle[0].index}) while the checks ran kernels: work done once for several timed "
                               "calls, or by a process the trace cannot see")]


def _launches(facts: list[CallFacts], checks: list[Call], expected: Expected,
              names: calls_mod.Names) -> list[dict[str, str]]:
    busy = [f for f in facts if f.records]
    if not busy:
        return []
    usual, _ = Counter(f.own_launches for f in busy).most_common(1)[0]
    odd = [f for f in busy if f.own_launches != usual]
    if odd:
        return [_flag("launch-mismatch", f"{len(odd)} of {len(facts)} timed calls launched other own kernels than the "
                                         f"rest (call {odd[0].index}: {_launch_text(odd[0].own_launches)}; most: "
                                         f"{_launch_text(usual)}): every timed call must do the same work")]
    mains = [c for c in checks if c.index in expected.main_checks]
    if not mains:
        return []
    counts = [Counter(r.name for r in c.work if isinstance(r, Kernel) and names.own(r.name)) for c in mains]
    floor = {name: min(c[name] for c in counts) for name in set().union(*counts)}
    have = dict(usual)
    short = sorted(name for name, n in floor.items() if n and have.get(name, 0) < n)
    if short:
        name = short[0]
        return [_flag("launch-mismatch", f"the timed calls launched {short_name(name, 60)} {have.get(name, 0)} time(s), "
                                         f"the main check {floor[name]}: a timed call must do the checked work")]
    return []


def _launch_text(launches: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{short_name(n, 40)} x{k}" for n, k in launches[:4]) or "none of its own"


def _intervals(timed: list[Call], loop: list[Call], outside: list[Any], names: calls_mod.Names) -> list[dict[str, str]]:
    late = [(c, r) for c in timed for r in c.work if r.end > c.hi + LATE_SLACK_NS]
    if late:
        c, r = late[0]
        return [_flag("outside-interval", f"{len(late)} record(s) of device work started inside a timed call and "
                                          f"ended after it (call {c.index}: {_what(r)} ran {(r.end - c.hi) / 1e3:.1f} "
                                          "us past the call's end): work left running past its call")]
    first, last = min(c.lo for c in loop), max(c.hi for c in loop)
    streams = {c.stream for c in loop}
    between = [r for r in outside if first <= r.start < last
               and ((isinstance(r, Kernel) and names.own(r.name)) or r.stream not in streams)]
    if between:
        r = between[0]
        return [_flag("outside-interval", f"{len(between)} record(s) of device work ran between the timed loop's calls "
                                          f"(first: {_what(r)} on stream {r.stream}, the calls' "
                                          f"{', '.join(map(str, sorted(streams)))}): work "
                                          "outside the calls that were timed")]
    return []


def _stats(facts: list[CallFacts], expected: Expected) -> tuple[float, float, float, float] | None:
    """(the checked median, the median call's busy ns, kernel ns, launches) in ns, or None."""
    median_ms = expected.median_ms
    if median_ms is None or not facts or not (0 <= median_ms < float("inf")):
        return None
    launches = statistics.median(sum(n for _, n in f.own_launches) + f.library_launches for f in facts)
    return (median_ms * 1e6, statistics.median(f.busy_ns for f in facts),
            statistics.median(f.kernel_ns for f in facts), launches)


def _untraced(facts: list[CallFacts], expected: Expected) -> list[dict[str, str]]:
    stats = _stats(facts, expected)
    if stats is None:
        return []
    median_ns, busy, _, launches = stats
    gap = median_ns - busy
    allowance = UNTRACED_SLACK_NS + UNTRACED_PER_LAUNCH_NS * launches
    if busy >= UNTRACED_SHARE * median_ns or gap <= allowance:
        return []
    gross = busy < UNTRACED_GROSS_SHARE * median_ns and gap > allowance + UNTRACED_GROSS_NS
    return [_flag("untraced-work", f"the device was busy {busy / 1e3:.1f} us in the median timed call by the kernel "
                                   f"trace, against a checked median of {median_ns / 1e3:.1f} us: work ran that the "
                                   "trace did not see", None if gross else "review")]


def _clock(facts: list[CallFacts], expected: Expected) -> list[dict[str, str]]:
    stats = _stats(facts, expected)
    if stats is None:
        return []
    median_ns, _, kernel, _ = stats
    if kernel <= CLOCK_FACTOR * median_ns + CLOCK_SLACK_NS:
        return []
    return [_flag("clock-mismatch", f"the kernel trace summed {kernel / 1e3:.1f} us of kernel time in the median "
                                    f"timed call, but the checked median is {median_ns / 1e3:.1f} us")]

"""The kernel trace's rules (issue 55, harness/trace/rules.py), as a table: each row builds a
trace with tests/tracefake.py (JSON Lines bytes as the tracer writes them), runs it through the
decoder (records.decode) and the rules (rules.judge), and compares the flags' kinds and
severities with the row's. Honest rows must raise nothing; each hostile row names the flags its
shape must raise, and `test_every_rule_has_a_row_that_needs_it` switches each rule off in turn
and checks that some row then fails. Recorded traces from a GPU (tests/traces/*.jsonl, each with
its *.expect.json) run through the same judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from kernelagent.harness.trace import calls as calls_mod
from kernelagent.harness.trace import records, rules
from kernelagent.harness.trace.calls import Expected
from tests.tracefake import COPY, FILL, GEMM, US, TraceFake, line_bytes, one, process

TRACES = Path(__file__).parent / "traces"
OWN = frozenset({"relu_kernel"})
CHECKS, WARMUPS, SEGMENTS, CALLS = 3, 2, 2, 4


def expect(median_us: float | None, own: frozenset[str] = OWN, **kw: Any) -> Expected:
    base = dict(own_names=own, checks=CHECKS, timed=SEGMENTS * CALLS, warmups=WARMUPS,
                median_ms=None if median_us is None else median_us / 1e3)
    base.update(kw)
    return Expected(**base)


# -- call bodies -------------------------------------------------------------------------------
def multi(fake: TraceFake, phase: str, index: int) -> None:
    """An honest call of several kernels with glue: a contiguous copy, two own kernels, a memset,
    a small library GEMM beside them."""
    fake.kernel(COPY, 30 * US)
    fake.kernel("fused_a", 40 * US)
    fake.memset(4096, 2 * US)
    fake.kernel(GEMM, 10 * US)
    fake.kernel("fused_b_0d1d2d", 25 * US)


def autotuned_first(fake: TraceFake, phase: str, index: int) -> None:
    """Triton's autotuner in the first call: every config benchmarked, several runs each."""
    for _ in range(24):
        fake.kernel("relu_kernel", 50 * US)
        fake.kernel(FILL, 1 * US)


def many_small(fake: TraceFake, phase: str, index: int) -> None:
    """Twenty 2 us launches whose host launches outlast the launch cover: the device waits."""
    for _ in range(20):
        fake.kernel("relu_kernel", 2 * US, gap=8 * US)


def early_start(fake: TraceFake, phase: str, index: int) -> None:
    """A kernel launched with programmatic dependent launch starts before the begin marker's end
    is stamped; the end marker's start is stamped 300 ns before the kernel's end (stamping jitter)."""
    fake.kernel("relu_kernel", 50 * US, gap=-500)
    fake.now -= 1_300


def one_call_descheduled(fake: TraceFake, phase: str, index: int) -> None:
    """The host is descheduled for 2 ms in one timed call of each segment: the device idles in it."""
    fake.kernel("relu_kernel", 50 * US)
    if phase == "timed" and index == 1:
        fake.idle(2_000 * US)


def untraced(hidden_us: float, own_us: float = 5) -> Callable[[TraceFake, str, int], None]:
    """CUPTI switched off around PyTorch work: the device runs `hidden_us` the trace never sees."""
    def body(fake: TraceFake, phase: str, index: int) -> None:
        fake.kernel("relu_kernel", int(own_us * US))
        fake.idle(int(hidden_us * US))
    return body


def nothing(fake: TraceFake, phase: str, index: int) -> None:
    """No device work in this process (a child process, or the injection cleared, does it)."""


def idle_timed(fake: TraceFake, phase: str, index: int) -> None:
    if phase == "timed":
        return
    fake.kernel("relu_kernel", 50 * US)


def every_fourth(fake: TraceFake, phase: str, index: int) -> None:
    """One launch serving several timed calls: the kernel runs in one call of four."""
    if phase != "timed" or index % 4 == 0:
        fake.kernel("relu_kernel", 50 * US)


def side_stream_late(fake: TraceFake, phase: str, index: int) -> None:
    fake.kernel("relu_kernel", 10 * US)
    if phase == "timed":  # its main work on another stream, still running after the end marker
        fake.kernel("relu_kernel", 80 * US, stream=9, start=fake.now + 1 * US)


def other_ctx(fake: TraceFake, phase: str, index: int) -> None:
    fake.kernel("relu_kernel", 5 * US)
    fake.kernel("relu_kernel", 40 * US, ctx=2, start=fake.now + 1 * US)


def checks_differ(fake: TraceFake, phase: str, index: int) -> None:
    """Checked calls run two kernels, timed calls only the first."""
    fake.kernel("relu_kernel", 30 * US)
    if phase != "timed":
        fake.kernel("relu_finish", 20 * US)


def alternating(fake: TraceFake, phase: str, index: int) -> None:
    fake.kernel("relu_kernel", 30 * US)
    if phase != "timed" or index % 2 == 0:
        fake.kernel("relu_kernel", 30 * US)


def torch_only(fake: TraceFake, phase: str, index: int) -> None:
    fake.kernel(GEMM, 60 * US)


def sliver(fake: TraceFake, phase: str, index: int) -> None:
    fake.kernel("relu_kernel", 5 * US)
    fake.kernel(GEMM, 100 * US)


def long_kernels(fake: TraceFake, phase: str, index: int) -> None:
    fake.kernel("relu_kernel", 200 * US)


def graph_replay(fake: TraceFake, phase: str, index: int) -> None:
    """A baseline's CUDA graph (torch.compile reduce-overhead): its kernels share one corr."""
    fake.corr += 1
    for name in (GEMM, "triton_poi_fused_relu_0"):
        fake.kernel(name, 30 * US, graph=5, corr=fake.corr)


# -- trace builders ----------------------------------------------------------------------------
def build(body: Callable[..., None], **kw: Any) -> Callable[[], bytes]:
    return lambda: process(body, checks=CHECKS, warmups=WARMUPS, segments=SEGMENTS, calls=CALLS, **kw).to_bytes()


def edited(body: Callable[..., None], edit: Callable[[list[dict[str, Any]]], None], **kw: Any) -> Callable[[], bytes]:
    """An honest process whose records `edit` changes before they are written (seq kept as listed)."""
    def make() -> bytes:
        fake = process(body, checks=CHECKS, warmups=WARMUPS, segments=SEGMENTS, calls=CALLS, **kw)
        lines = [dict(seq=i, **r) for i, r in enumerate(fake.lines)]
        edit(lines)
        return b"".join(line_bytes(r) for r in lines)
    return make


def markers_of(lines: list[dict[str, Any]], phase: int) -> list[int]:
    return [i for i, r in enumerate(lines) if r["t"] == "kernel" and r["name"] == "kernelagent_trace_marker"
            and r["grid"][1] == phase]


def drop_marker(lines: list[dict[str, Any]]) -> None:
    del lines[markers_of(lines, 3)[5]]
    for i, r in enumerate(lines):
        r["seq"] = i


def duplicate_timed_call(lines: list[dict[str, Any]]) -> None:
    """A forged extra pair of markers (the candidate calls the library's mark itself)."""
    at = markers_of(lines, 3)
    lines[at[1] + 1:at[1] + 1] = [dict(lines[at[0]], corr=900001, start=lines[at[1]]["end"] + 10,
                                       end=lines[at[1]]["end"] + 20),
                                  dict(lines[at[1]], corr=900002, start=lines[at[1]]["end"] + 30,
                                       end=lines[at[1]]["end"] + 40)]
    for i, r in enumerate(lines):
        r["seq"] = i


def skip_index(lines: list[dict[str, Any]]) -> None:
    for i in markers_of(lines, 3)[2:4]:
        lines[i]["grid"][0] = 3 + 1  # call 1 says it is call 3
    for i, r in enumerate(lines):
        r["seq"] = i


def no_hello(lines: list[dict[str, Any]]) -> None:
    """Records without the tracer's hello (a library of the candidate's writing the channel)."""
    del lines[0]
    for i, r in enumerate(lines):
        r["seq"] = i


def wide_marker(lines: list[dict[str, Any]]) -> None:
    """A kernel of the marker's name but not its shape (the candidate's own, named like ours)."""
    lines[markers_of(lines, 3)[2]]["block"] = [32, 1, 1]


def cut_after_timed(lines: list[dict[str, Any]]) -> None:
    """The tracer switched off (CUPTI finalised) after the third timed call: nothing after it."""
    del lines[markers_of(lines, 3)[5] + 1:]


def seq_gap(lines: list[dict[str, Any]]) -> None:
    for r in lines[10:]:
        r["seq"] += 1


def seq_duplicate(lines: list[dict[str, Any]]) -> None:
    lines.insert(12, dict(lines[12]))


def corr_duplicate(lines: list[dict[str, Any]]) -> None:
    own = [r for r in lines if r["t"] == "kernel" and r["name"] == "relu_kernel"]
    own[5]["corr"] = own[4]["corr"]


def backwards(lines: list[dict[str, Any]]) -> None:
    own = [r for r in lines if r["t"] == "kernel" and r["name"] == "relu_kernel"]
    own[6]["end"] = own[6]["start"] - 1


def after_final(lines: list[dict[str, Any]]) -> None:
    lines.append(dict(lines[-2], seq=len(lines)))


def second_hello(lines: list[dict[str, Any]]) -> None:
    lines[20] = {"seq": 20, "t": "hello", "v": 1, "pid": 1, "cupti": 26, "ts": 5}


def with_dropped(lines: list[dict[str, Any]]) -> None:
    lines.insert(30, {"t": "dropped", "n": 17})
    for i, r in enumerate(lines):
        r["seq"] = i


def between_calls(fake: TraceFake, n: int) -> None:
    """Deferred work: a library kernel on another stream between two timed calls."""
    if n == 5:
        fake.kernel(GEMM, 300 * US, stream=9, start=fake.now + 2 * US)


def own_between_calls(fake: TraceFake, n: int) -> None:
    """Deferred work on the calls' own stream: an own kernel queued to run after a timed call."""
    if n == 5:
        fake.kernel("relu_kernel", 300 * US)


def no_bytes() -> bytes:
    return b""


def cut_mid_record() -> bytes:
    data = build(one("relu_kernel"))()
    return data[:len(data) - 17]


def garbage_line() -> bytes:
    data = build(one("relu_kernel"))()
    lines = data.split(b"\n")
    lines.insert(40, b'{"seq":40,"t":"kernel","name":"relu_kernel","grid":[[1]]}')
    return b"\n".join(lines)


def overflowing() -> bytes:
    return b"{}\n" * (records.MAX_RECORDS + 1)


# (id, trace bytes, expected, {flag kind: severity})
ROWS: list[tuple[str, Callable[[], bytes], Expected, dict[str, str]]] = [
    # honest
    ("honest-triton-single", build(one("relu_kernel")), expect(51), {}),
    ("honest-multi-kernel-glue", build(multi), expect(113, frozenset({"fused_a", "fused_b"})), {}),
    ("honest-autotune-first-call", build(one("relu_kernel"), first=autotuned_first), expect(51), {}),
    ("honest-tiny-kernel-launch-gaps", build(one("relu_kernel", 3)), expect(8), {}),
    ("honest-many-launches-host-bound", build(many_small), expect(200), {}),
    ("honest-baseline-torch-and-graphs", build(graph_replay), expect(62, frozenset(), baseline=True), {}),
    ("honest-early-start-and-stamp-jitter", build(early_start), expect(49), {}),
    ("honest-one-call-descheduled", build(one_call_descheduled), expect(51), {}),
    ("honest-cuda-mangled-names", build(one("_Z11relu_kernelPKfPfi")), expect(51), {}),
    ("honest-no-warmup-count-known", build(one("relu_kernel")), expect(51, warmups=None), {}),
    # the tracer switched off, cut short or never there
    ("tracer-never-loaded", no_bytes, expect(51), {"trace-missing": "reject"}),
    ("tracer-switched-off-mid-loop", edited(one("relu_kernel"), cut_after_timed), expect(51),
     {"trace-missing": "reject"}),
    ("no-hello", edited(one("relu_kernel"), no_hello), expect(51), {"trace-missing": "reject"}),
    ("no-final-flush", build(one("relu_kernel"), final=False), expect(51), {"trace-missing": "reject"}),
    ("cut-mid-record", cut_mid_record, expect(51), {"trace-missing": "reject"}),
    ("marker-missing", edited(one("relu_kernel"), drop_marker), expect(51), {"trace-missing": "reject"}),
    ("marker-pair-duplicated", edited(one("relu_kernel"), duplicate_timed_call), expect(51),
     {"trace-missing": "reject"}),
    ("marker-out-of-order", edited(one("relu_kernel"), skip_index), expect(51), {"trace-missing": "reject"}),
    ("marker-of-another-shape", edited(one("relu_kernel"), wide_marker), expect(51), {"trace-missing": "reject"}),
    ("marker-phase-not-run", build(one("relu_kernel")), expect(51, phases=frozenset({"first", "check", "timed"})),
     {"trace-missing": "reject"}),
    # forged records
    ("forged-seq-gap", edited(one("relu_kernel"), seq_gap), expect(51), {"trace-forged": "reject"}),
    ("forged-seq-duplicate", edited(one("relu_kernel"), seq_duplicate), expect(51), {"trace-forged": "reject"}),
    ("forged-corr-duplicate", edited(one("relu_kernel"), corr_duplicate), expect(51), {"trace-forged": "reject"}),
    ("forged-end-before-start", edited(one("relu_kernel"), backwards), expect(51), {"trace-forged": "reject"}),
    ("forged-after-final-flush", edited(one("relu_kernel"), after_final), expect(51), {"trace-forged": "reject"}),
    ("forged-second-hello", edited(one("relu_kernel"), second_hello), expect(51), {"trace-forged": "reject"}),
    ("forged-line-not-a-record", garbage_line, expect(51), {"trace-forged": "reject"}),
    # holes: not the candidate's verdict, the evidence falls back
    ("dropped-records", edited(one("relu_kernel"), with_dropped), expect(51), {"trace-incomplete": "info"}),
    ("over-the-caps", overflowing, expect(51), {"trace-incomplete": "info"}),
    # who did the work
    ("child-process-does-all-work", build(nothing), expect(300),
     {"no-custom-kernel": "reject", "untraced-work": "reject"}),
    ("injection-cleared-before-timing", build(idle_timed), expect(2),
     {"idle-call": "reject", "no-custom-kernel": "reject"}),
    ("one-launch-serves-four-calls", build(every_fourth), expect(2), {"idle-call": "reject"}),
    ("torch-only", build(torch_only), expect(62), {"no-custom-kernel": "reject"}),
    ("sliver-of-own-work", build(sliver), expect(107), {"hidden-work": "reject"}),
    ("checks-differ-from-timed", build(checks_differ), expect(32, frozenset({"relu_kernel", "relu_finish"})), {"launch-mismatch": "reject"}),
    ("timed-calls-differ", build(alternating), expect(62), {"launch-mismatch": "reject"}),
    # where and when it ran
    ("side-stream-past-the-call", build(side_stream_late), expect(12), {"outside-interval": "reject"}),
    ("work-between-timed-calls", build(one("relu_kernel"), between=between_calls), expect(51),
     {"outside-interval": "reject"}),
    ("own-kernel-between-timed-calls", build(one("relu_kernel"), between=own_between_calls), expect(51),
     {"outside-interval": "reject"}),
    ("kernel-in-another-context", build(other_ctx), expect(7), {"other-context": "reject"}),
    # what the trace saw against the server's clock
    ("cupti-off-around-torch-work", build(untraced(500)), expect(507), {"untraced-work": "reject"}),
    ("cupti-off-around-some-work", build(untraced(90, own_us=60)), expect(152), {"untraced-work": "review"}),
    ("kernels-longer-than-median", build(long_kernels), expect(100), {"clock-mismatch": "review"}),
]


def verdict_of(make: Callable[[], bytes], expected: Expected) -> rules.TraceVerdict:
    return rules.judge_bytes(make(), expected)


def flags_of(verdict: rules.TraceVerdict) -> dict[str, str]:
    return {f["kind"]: f["severity"] for f in verdict.flags}


@pytest.mark.parametrize("make,expected,flags", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_trace_rules(make, expected, flags):
    verdict = verdict_of(make, expected)
    assert flags_of(verdict) == flags, [f["message"] for f in verdict.flags]
    for f in verdict.flags:
        assert f["message"] and f["message"].isprintable() and len(f["message"]) < 600
    assert verdict.rejected == ("reject" in flags.values())
    assert bool(verdict.incomplete) == ("trace-incomplete" in flags)


def test_honest_facts_describe_the_timed_calls():
    verdict = verdict_of(build(multi), expect(113, frozenset({"fused_a", "fused_b"})))
    facts = verdict.facts
    assert len(facts.calls) == SEGMENTS * CALLS and all(c.phase == "timed" for c in facts.calls)
    call = facts.calls[0]
    assert (call.own_ns, call.library_ns, call.glue_ns) == (65 * US, 10 * US, 32 * US)
    assert call.own_launches == (("fused_a", 1), ("fused_b_0d1d2d", 1)) and call.streams == (7,)
    assert facts.kernel_ms_per_call == pytest.approx(0.105) and facts.marker_stream == 7
    json.dumps(facts.to_dict())


# -- each rule is needed -----------------------------------------------------------------------
def _off_pairing(trace, expected):
    found, _ = REAL_PAIR(trace, expected)
    return found, ""


REAL_PAIR = calls_mod.pair_markers
# rule -> (where it lives, its name there, what it is switched off to)
RULES_OFF: dict[str, tuple[Any, str, Any]] = {
    "trace-forged": (rules, "_forged", lambda trace: ""),
    "trace-forged (decoder)": (rules, "decode_failure", lambda error: rules.TraceVerdict()),
    "trace-missing (markers)": (calls_mod, "pair_markers", _off_pairing),
    "no-custom-kernel": (rules, "_no_custom", lambda facts, expected: []),
    "hidden-work": (rules, "_hidden", lambda facts: []),
    "idle-call": (rules, "_idle", lambda facts, checks: []),
    "launch-mismatch": (rules, "_launches", lambda facts, checks, expected, names: []),
    "outside-interval": (rules, "_intervals", lambda *a: []),
    "untraced-work": (rules, "_untraced", lambda facts, expected: []),
    "clock-mismatch": (rules, "_clock", lambda facts, expected: []),
    "other-context": (rules, "_other_context", lambda *a: []),
    "trace-missing (final flush)": (rules, "_finished", lambda trace: True),
    "trace-missing (hello)": (rules, "_started", lambda trace: True),
    "trace-incomplete": (rules, "_dropped", lambda dropped: False),
}


@pytest.mark.parametrize("rule", sorted(RULES_OFF))
def test_every_rule_has_a_row_that_needs_it(rule, monkeypatch):
    where, name, off = RULES_OFF[rule]
    monkeypatch.setattr(where, name, off)
    failing = [row[0] for row in ROWS if flags_of(verdict_of(row[1], row[2])) != row[3]]
    assert failing, f"no row fails with {rule} switched off"
    assert not [r for r in failing if r.startswith("honest")]


# -- recorded traces from a GPU ----------------------------------------------------------------
def expected_from_json(data: dict[str, Any]) -> Expected:
    data = dict(data)
    for key in ("own_names", "phases"):
        if key in data:
            data[key] = frozenset(data[key])
    if "main_checks" in data:
        data["main_checks"] = tuple(data["main_checks"])
    return Expected(**data)


RECORDED = sorted(TRACES.glob("*.jsonl")) if TRACES.is_dir() else []


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_trace(path):
    """A trace recorded on a GPU, with `<name>.expect.json`: {"expected": {Expected's fields},
    "flags": {kind: severity}} (an honest recording has "flags": {})."""
    sidecar = path.with_name(path.stem + ".expect.json")
    assert sidecar.is_file(), f"{path.name} has no {sidecar.name}"
    want = json.loads(sidecar.read_text())
    verdict = rules.judge_bytes(path.read_bytes(), expected_from_json(want["expected"]))
    assert flags_of(verdict) == want["flags"], [f["message"] for f in verdict.flags]

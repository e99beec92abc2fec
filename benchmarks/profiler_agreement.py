"""Does the harness's clock agree with the profiler's? Issue 13, scope 2 (an independent clock).

For every problem of a benchmark directory that has a solution, two evaluations (a profiled job is
never traced, since torch.profiler needs CUPTI to itself): a PROFILED one (`profiled_config`:
torch.profiler's calls, no timed loop) and a TIMED one (`timed_config`: the harness's timed loop
and, on a GPU, its kernel trace judged as the evidence alone: `kernel_evidence=True,
audit_share=0`) give these numbers per forward call:
  harness ms   the harness's DEVICE time per call (issue 58: the timed run's per_call.device_ms, the
               median timed call's summed kernel time on the device's clock, from the kernel trace);
               where the result has none (the CPU, an incomplete trace, --device-clock off) the row
               says why and falls back to the wall time (timings.candidate.median_ms), marked WALL
  wall ms      the timed run's wall time per call (per_call.wall_ms: L2 flushed before each call,
               synchronised, host time included) and its host share, (wall - device) / wall
  profiler ms  the device time of every kernel torch.profiler saw, summed, per call (the profiled
               run: the median of 5 calls on the main inputs in the candidate's process, after
               one unprofiled call and the timer's clock ramp, L2 flushed before each, holding
               the device alone: child/kernel_profile.py)
  wall diff %  the wall time against the profiler's (the figure judged before issue 58)
and a third clock, Nsight Compute's
  ncu ms       gpu__time_duration of every kernel, summed per call (the kernel evidence's ncu run,
               outside the candidate's process: caches flushed before each kernel, clocks as they are)
which explains a miss when it agrees with the harness and not with the profiler. The target: the
harness figure and the profiler's agree within 3% for kernels of 50 us or more
(harness/caller/profiling.py: clocks, AGREEMENT_PCT, AGREEMENT_MIN_MS). A row whose evaluations
were not both correct is not judged.

Every miss is re-run once ALONE (nothing else in flight, its two evaluations one after the other)
with the ncu run on its profiled evaluation, and carries a `cause`
(benchmarks/miss_cause.py): its neighbours (evaluations in flight, whether it shared the device,
its slot and idle waits, a harness re-run alone), the SM clock over its loop, its host share, the
memory-bandwidth facts of its idle probes, and the re-run alone's figures beside its own; a fact
not recorded says "not recorded". The table prints it; the JSON keeps it.

    python benchmarks/profiler_agreement.py [--suite ours|kernelbench|both] [--problems DIR --solutions DIR]
        [--filter GLOB] [--max-minutes 7] [--jobs 8] [--out agreement.jsonl] [--summary agreement.md]
        [--device auto] [--isolation auto] [--device-clock trace|off] [--third-clock misses|off]

One harness server for the whole run (torch and triton are imported once), with `--jobs N`
problems in flight at once (default 8), each problem's two evaluations submitted together (one
`map`), and the server admitting N evaluations (the rest wait in its queue, so it never idles
while a problem's slower evaluation runs on): the server overlaps their host work (imports,
compiles, checks) while each timed loop and each profile holds the device alone
(server/gate.py), so the clocks compared are those of a job alone on the GPU. The first pass runs
without Nsight Compute (its sessions run one at a time on a host, ~5 s each); each miss is then
re-run alone with it (`--third-clock misses`), one at a time, in the last `--third-share` of the
time. `--max-minutes` caps the run: no problem starts once the time spent plus the median problem
so far (its waits included) would pass its pass's share; the problems left are listed as "not run
(time cap)", and Ctrl-C prints the table of what was measured. Each row is appended to `--out`
(JSON lines) as soon as it is measured, with the GPU, driver, torch and triton versions and each
evaluation's `stage_seconds`. Needs none of litellm, openai, tenacity or pydantic (run with
PYTHONPATH=.).

Cost. Two evaluations per problem cost about what one did before the device clock (a profiled run
with its timed loop and every check: the earlier 320 s run of the 62 problems of `--suite both`
at --jobs 8), because each runs only what its clock needs (`CLOCKS_ONLY`: one check on the main
inputs; no signed-normal, near-one, extra or derived input sets, post-timing check or baselines:
correctness is bench's and fidelity's to judge, with every check): the profiled one holds the
device only for its profile (no loop, no calibration, no in-process device-share profile), the
timed one for its calibration and loop, which the one evaluation held before too; the second
evaluation adds a start (fork, device context, imports, the candidate's compile) on the host,
beside the other's. Measured on the CPU (2026-11-29, the interpreter on a busy 2-core host:
relative figures only; our 12_cumsum, 13_transpose and 14_sigmoid, three runs of each version at
--jobs 1, per-problem medians summed; `stage_seconds` of each row): the checks' stages 3.2 s for
both evaluations against 6.8 s for the one before, the job processes' CPU 11.6 against 11.2 CPU-s
(1.04x), the rows 22.5 against 18.1 s (1.25x, the two one after the other in a one-job server);
the interpreter's timed loop is sized by its own call latency and read 5.4 s to 11.2 s with the
host's load (one server alternating the two configurations read 3.5-3.8 s against 4.1-4.5 s).
Not yet measured on a GPU (2026-11-29): the two evaluations' cost there, the device clock's rows
and the causes were written and tested on the CPU only (tests/test_profiler_agreement_script.py).

On the CPU it runs end to end (the timed evaluation has no trace there), but the harness time is
the Triton interpreter's and the profiler's rows are CPU ops: every row says "not meaningful" and
no agreement is judged.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import statistics
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from kernelagent.bench.discover import discover, find_candidates  # noqa: E402
from kernelagent.harness.caller import profiling  # noqa: E402
from kernelagent.harness.caller.profiling import AGREEMENT_PCT  # noqa: E402

sys.path.insert(0, str(HERE))  # miss_cause beside this script
import miss_cause  # noqa: E402


def kernelbench_dir() -> Path:
    """KernelBench's problems: ../shared/kernelbench (beside the checkout) or ./shared/kernelbench."""
    for base in (ROOT.parent / "shared", ROOT / "shared"):
        path = base / "kernelbench" / "KernelBench"
        if path.is_dir():
            return path
    return ROOT.parent / "shared" / "kernelbench" / "KernelBench"


def suites(args: argparse.Namespace) -> list[tuple[str, Path, Path]]:
    if args.problems or args.solutions:
        if not (args.problems and args.solutions):
            raise SystemExit("error: --problems and --solutions go together")
        return [("custom", Path(args.problems), Path(args.solutions))]
    chosen = []
    if args.suite in ("ours", "both"):
        chosen.append(("ours", HERE / "level1", HERE / "solutions"))
    if args.suite in ("kernelbench", "both"):
        chosen.append(("kb", kernelbench_dir(), HERE / "kernelbench_solutions"))
    return chosen


def pairs(args: argparse.Namespace) -> tuple[list[tuple[str, Path, Path]], list[str]]:
    """(label, problem, solution) for every problem that has a solution, and notes on the rest."""
    out, notes = [], []
    for tag, problems, solutions in suites(args):
        if not problems.exists():
            notes.append(f"{tag}: {problems} not found: skipped")
            continue
        for ref in discover(problems):
            label = f"{tag}/{ref.key}"
            if args.filter and not (fnmatch.fnmatch(label, args.filter) or fnmatch.fnmatch(ref.key, args.filter)
                                    or fnmatch.fnmatch(ref.name, args.filter)):
                continue
            found = find_candidates(solutions, ref)
            if found:
                out.append((label, ref.path, found[0]))
    return out, notes


def device_clock(timed, traced: bool = True) -> tuple[dict | None, str | None]:
    """The harness's device time per call (result.per_call of the timed evaluation, traced), or
    None and why not. A profiled job is never traced (torch.profiler needs CUPTI to itself:
    server/trace_stage.open_for), so the device clock comes from the other, timed evaluation."""
    if timed is None:
        return None, "no timed evaluation"
    if not (timed.fingerprint or {}).get("cuda"):
        return None, "no GPU: no kernel trace on the CPU"
    if not traced:
        return None, "the timed evaluation was not traced (--device-clock off)"
    if timed.status != "correct":
        return None, f"the timed evaluation was {timed.status}"
    if timed.per_call is None:
        evidence = timed.kernel_evidence or {}
        incomplete = (evidence.get("trace") or {}).get("incomplete") if isinstance(evidence.get("trace"), dict) else None
        if incomplete:
            return None, f"the trace was incomplete: {str(incomplete)[:120]}"
        return None, "no device clock in the result: " + str(evidence.get("unavailable") or evidence.get("fallback")
                                                             or "no trace was read")[:120]
    clock = timed.per_call
    return {"device_ms": clock.device_ms, "wall_ms": clock.wall_ms, "host_share": clock.host_share,
            "source": clock.source}, None


# What a row keeps of each evaluation's `concurrency` for its cause (benchmarks/miss_cause.py).
CONCURRENCY_KEYS = ("shared_device", "alone", "retried_alone", "wait_s", "idle_wait_s", "held_s", "copy_us",
                    "bandwidth_wait_s", "bandwidth_busy", "alloc_retries")


def facts(result, in_flight: int | None) -> dict:
    """What an evaluation met, for a miss's cause: its concurrency, the SM clock over its loop."""
    timing = result.timings.get("candidate")
    return {"concurrency": {k: v for k, v in (result.concurrency or {}).items() if k in CONCURRENCY_KEYS},
            "clocks_mhz": list(timing.clocks_mhz) if timing and timing.clocks_mhz else None, "in_flight": in_flight}


def row_from(label: str, profiled, timed=None, seconds: float = 0.0, in_flight: int | None = None,
             traced: bool = True) -> dict:
    """One problem's row from its profiled evaluation (the profiler's clock) and its timed one
    (the harness's clocks: the device time per call from its trace, and its wall time per call).
    Agreement is judged on the device clock; where there is none the row says why and falls back
    to the timed run's wall figure, marked. `traced`: the timed evaluation was asked for its trace
    (--device-clock trace)."""
    result = profiled
    fp = result.fingerprint or {}
    # the row's status: the first evaluation that was not correct (the profiled one first)
    failed = next((r for r in (profiled, timed) if r is not None and r.status != "correct"), None)
    row = {"problem": label, "status": (failed or result).status, "passed": result.passed and bool(timed and timed.passed),
           "gpu": fp.get("gpu_name") or "cpu", "driver": fp.get("driver"), "torch": fp.get("torch"),
           "triton": fp.get("triton"), "python": fp.get("python"), "seconds": round(seconds, 2)}
    # profiling.clocks on the two evaluations together: the timed run's median (its wall clock) and
    # the profiled run's kernels (the profiler's clock).
    both = dataclasses.replace(profiled, timings=dict(timed.timings) if timed is not None else {})
    clocks = profiling.clocks(both)
    row.update({k: clocks.get(k) for k in ("harness_ms", "harness_source", "profiler_ms", "host_overhead_ms",
                                           "diff_pct", "within_pct", "meaningful", "kind", "kernels", "note")})
    if "unavailable" in clocks:
        row["note"] = clocks["unavailable"]
        row["meaningful"] = False
    # The wall clock against the profiler's, as judged before issue 58, kept beside the judged figure.
    row["wall_diff_pct"] = row.get("diff_pct")
    clock, why = device_clock(timed, traced)
    row["device_clock"] = clock
    row["device_ms"] = clock["device_ms"] if clock else None
    row["wall_ms"] = clock["wall_ms"] if clock else row.get("harness_ms")
    row["host_share"] = clock["host_share"] if clock else None
    row["harness_clock"] = "device" if clock else "wall (fallback: " + str(why) + ")"
    profiler_ms = row.get("profiler_ms")
    if clock and profiler_ms:
        row["harness_ms"] = clock["device_ms"]
        row["diff_pct"] = 100.0 * (clock["device_ms"] - profiler_ms) / profiler_ms
        if row.get("meaningful") and profiler_ms >= profiling.AGREEMENT_MIN_MS:
            row["within_pct"] = abs(row["diff_pct"]) <= AGREEMENT_PCT
    if failed is not None:  # no clock of an evaluation that was not correct is judged
        which = "profiled" if failed is profiled else "timed"
        row["note"] = f"the {which} evaluation: " + ((failed.reason or "").strip().splitlines() or [failed.status])[0][:200]
        row["within_pct"] = None
    # The third clock: Nsight Compute's gpu__time_duration of every kernel, summed per call (the
    # kernel evidence's ncu run, outside the candidate's process: the re-run alone's profiled
    # evaluation asks for it; a timed evaluation whose trace fell back to ncu has one too).
    evidence = next((r.kernel_evidence for r in (profiled, timed)
                     if r is not None and (r.kernel_evidence or {}).get("per_call_ms") is not None),
                    result.kernel_evidence) or {}
    row["ncu_ms"] = evidence.get("per_call_ms")
    row["ncu_note"] = None if row["ncu_ms"] is not None else str(evidence.get("unavailable") or "not collected")[:200]
    for name in ("harness", "profiler"):
        ms = row.get(f"{name}_ms")
        row[f"{name}_vs_ncu_pct"] = (100.0 * (ms - row["ncu_ms"]) / row["ncu_ms"]
                                     if ms is not None and row["ncu_ms"] else None)
    timing = timed.timings.get("candidate") if timed is not None else None
    row["reps"] = timing.reps if timing else None
    judged = timed if timed is not None else result  # the run whose clocks are judged
    span = (judged.concurrency or {}).get("span")
    row["span"] = span if isinstance(span, list) and len(span) == 2 else None  # the server's, for overlap
    profiled_span = (result.concurrency or {}).get("span")
    row["profiled_span"] = profiled_span if isinstance(profiled_span, list) and len(profiled_span) == 2 else None
    concurrency = judged.concurrency or {}
    row["retried_alone"] = bool(concurrency.get("retried_alone"))
    # the allocator gave memory back while timed work ran (a full device): on the first try beside
    # others (which had it re-run alone) and on the run that counts
    row["alloc_retries"] = {"first_try": concurrency.get("first_try_alloc_retries"),
                            "counted": concurrency.get("alloc_retries")}
    # What each evaluation met, for a miss's cause: the judged figure's run first.
    row["facts"] = {"harness": facts(judged, in_flight), "profiler": facts(result, in_flight)}
    row["facts"]["harness"]["per_call"] = clock
    # Where each evaluation's time went (result.stage_seconds: the server's stage clocks, its CPU
    # seconds, the caller's totals), for the run's cost per problem.
    row["stage_seconds"] = {name: stage_seconds(r) for name, r in (("profiled", result), ("timed", timed))
                            if r is not None}
    return row


def stage_seconds(result) -> dict[str, float]:
    """An evaluation's stage clocks, rounded (numbers only)."""
    return {k: round(float(v), 3) for k, v in sorted((result.stage_seconds or {}).items())
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


# The two evaluations of a problem. This run judges two clocks of a candidate already known to be
# correct (our own solutions; bench and fidelity judge them with every check), so each evaluation
# runs only what its clock needs; the harness's defaults stay as they are for every other caller.
# Off in both, and why that is safe here:
CLOCKS_ONLY = dict(
    trials=1,  # one check on the main inputs: the candidate's process is loaded, compiled and seen
               # correct before its clock is read, and the trace's launch floor (trace/rules.py
               # `launch-mismatch`) has its main check (trace/calls.Expected.main_checks = (0,))
    baselines=False,  # no Inductor or eager time is compared here (and no win to audit)
    alt_distribution=False,  # signed-normal inputs: a correctness defence, not a clock
    near_one_inputs=False,  # inputs near one for scans and products: likewise
    extra_inputs=False, derived_checks=0,  # other shapes (the problem's or derived): likewise; both
                                           # clocks are read on the main inputs only
    post_timing_check=False,  # fresh inputs after the loop (output caching): the trace judges
                              # the timed calls themselves (idle-call, launch-mismatch)
)


def profiled_config(*, ncu: bool = False):
    """The profiler's clock: torch.profiler's median of 5 calls on the main inputs (child/kernel_profile.py
    profile_kernels: new inputs, one unprofiled call and a clock ramp first, L2 flushed before each, holding the
    device's slot with the device probed idle). No timed loop: the profile never used its state
    (it ran after the post-timing check, in a slot of its own) and its wall clock is the timed
    evaluation's now. No in-process device-share profile (min_own_device_share): the timed
    evaluation's trace judges the share out of process. `ncu`: the kernel evidence's Nsight
    Compute run too (an untraced job: ncu is its evidence), the third clock of a re-run alone."""
    from kernelagent.harness.config import EvalConfig

    return EvalConfig(**CLOCKS_ONLY, profile=True, timing=False, min_own_device_share=None, kernel_evidence=ncu)


def timed_config(*, traced: bool = True):
    """The harness's clocks: the timed loop as every evaluation runs it (the harness's loop
    settings and defences, untouched), its median the wall clock; `traced` (--device-clock
    trace): its kernel trace judged as the evidence alone (kernel_evidence on, audit_share 0: no
    Nsight Compute), which gives per_call.device_ms, the figure judged. Not traced (off): neither
    the tracer nor the evidence, the wall clock of an untraced process as before issue 58."""
    from kernelagent.harness.config import EvalConfig

    return EvalConfig(**CLOCKS_ONLY, profile=False, kernel_evidence=traced, audit_share=0.0, trace=traced)


def measure(evaluator, label: str, problem: Path, solution: Path, evidence: bool = False,
            device: bool = True, in_flight: int | None = None, together: bool = True) -> dict:
    """The profiled evaluation and the timed one (`profiled_config`, `timed_config`), submitted
    together (`evaluator.map`: the server overlaps their host work; each timed loop and each
    profile still holds the device alone), or one after the other where `together` is false (a
    re-run alone: nothing beside it)."""
    started = time.monotonic()
    source = solution.read_text()
    jobs = [(problem, source, profiled_config(ncu=evidence)), (problem, source, timed_config(traced=device))]
    if together:
        profiled, timed = evaluator.map(jobs)
    else:
        profiled, timed = (evaluator.evaluate(*job) for job in jobs)
    return row_from(label, profiled, timed, time.monotonic() - started, in_flight, traced=device)


RERUN_KEYS = ("status", "harness_clock", "harness_ms", "device_ms", "wall_ms", "host_share", "profiler_ms",
              "diff_pct", "within_pct", "ncu_ms", "ncu_note", "harness_vs_ncu_pct", "profiler_vs_ncu_pct", "seconds",
              "retried_alone")


def rerun_alone(evaluator, row: dict, problem: Path, solution: Path, device: bool = True) -> dict:
    """One more evaluation of a miss, alone (the script runs nothing beside it), with the kernel
    evidence's ncu run for a third clock: its figures beside the first's (the first evaluation's
    verdict stands; this one says whether the miss repeats alone, and why it missed)."""
    again = measure(evaluator, row["problem"], problem, solution, evidence=True, device=device, in_flight=1,
                    together=False)
    out = {k: again.get(k) for k in RERUN_KEYS}
    out["alone"] = True
    out["shared_device"] = again["facts"]["harness"]["concurrency"].get("shared_device")
    return out


def attach_cause(row: dict) -> None:
    """A miss carries what it met (issue 58, scope 3): benchmarks/miss_cause.py's record from the
    judged evaluation's facts and its re-run alone."""
    seen = (row.get("facts") or {}).get("harness") or {}
    rerun = row.get("rerun_alone") or miss_cause.NOT_RECORDED
    if isinstance(rerun, dict) and rerun.get("status") == "not run":
        rerun = "not run (" + str(rerun.get("why") or "time cap") + ")"
    row["cause"] = miss_cause.cause(concurrency=seen.get("concurrency"), clocks_mhz=seen.get("clocks_mhz"),
                                    per_call=seen.get("per_call"), in_flight=seen.get("in_flight"),
                                    rerun_alone=rerun)
    if isinstance(rerun, dict):
        row["cause"]["rerun_alone"] = {"first": {k: row.get(k) for k in ("harness_clock", "harness_ms", "profiler_ms",
                                                                        "diff_pct")},
                                       "alone": rerun}


def rerun_text(row: dict) -> str | None:
    both = (row.get("cause") or {}).get("rerun_alone")
    if not isinstance(both, dict):
        return None
    first, alone = both["first"], both["alone"]
    return (f"re-run alone: {fmt(alone.get('harness_ms'), '.4f')} vs profiler {fmt(alone.get('profiler_ms'), '.4f')} ms "
            f"({fmt(alone.get('diff_pct'), '+.1f')}%, {str(alone.get('harness_clock', '?')).split(' ')[0]} clock; "
            f"first {fmt(first.get('diff_pct'), '+.1f')}%)")


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def verdict(row: dict) -> str:
    if row.get("status") == "not run":
        return "not run (time cap)"
    if row.get("status") not in ("correct", None):
        return f"not judged ({row['status']})"
    if not row.get("meaningful"):
        return "not meaningful" + (" (CPU)" if row.get("gpu") == "cpu" else "")
    if row.get("within_pct") is None:
        return "n/a (<50 us)"
    if row["within_pct"]:
        return "yes"
    return "no: " + explain(row)


def explain(row: dict) -> str:
    """A miss, explained by the third clock or said to be unexplained. The clocks come from its
    re-run alone, with the kernel evidence's ncu run (`rerun_alone`), or from the row itself where
    it had one. Where ncu's kernel time agrees with the harness within the target and not with
    the profiler, the profiler's reading is the odd one out (not the harness's); a miss that the
    re-run alone does not repeat is explained when the profiler's reading moved by more than the
    target between the two while the harness's held within it (the profiler's first reading was
    the odd one out: issue 58, its calls beside other evaluations on an H200); anything else is
    unexplained by the clocks: its `cause` says what it met."""
    third = row.get("rerun_alone") or row
    if third is not row and third.get("within_pct"):
        moved = {k: _moved(row.get(k), third.get(k)) for k in ("harness_ms", "profiler_ms")}
        if moved["harness_ms"] is not None and moved["profiler_ms"] is not None \
                and abs(moved["harness_ms"]) <= AGREEMENT_PCT < abs(moved["profiler_ms"]):
            return (f"explained: the profiler's first reading did not repeat (alone it moved "
                    f"{moved['profiler_ms']:+.1f}%, the harness's {moved['harness_ms']:+.1f}%; alone they agree, "
                    f"{fmt(third.get('diff_pct'), '+.1f')}%)")
        return f"UNEXPLAINED: did not repeat alone (the re-run alone read {fmt(third.get('diff_pct'), '+.1f')}%)"
    to_harness, to_profiler = third.get("harness_vs_ncu_pct"), third.get("profiler_vs_ncu_pct")
    if to_harness is None or to_profiler is None:
        return "UNEXPLAINED (no ncu clock: " + str(third.get("ncu_note") or "?")[:80] + ")"
    if abs(to_harness) <= AGREEMENT_PCT < abs(to_profiler):
        return f"explained: ncu agrees with the harness ({to_harness:+.1f}%), the profiler reads {to_profiler:+.1f}%"
    return f"UNEXPLAINED (harness {to_harness:+.1f}%, profiler {to_profiler:+.1f}% of ncu)"


def _moved(first: float | None, alone: float | None) -> float | None:
    """How far a clock's reading moved from the first pass to the re-run alone, in % of the first."""
    if not isinstance(first, (int, float)) or not isinstance(alone, (int, float)) or not first > 0:
        return None
    return 100.0 * (alone - first) / first


def explained(row: dict) -> bool:
    return verdict(row).startswith("no: explained")


def clock_cell(row: dict) -> str:
    clock = str(row.get("harness_clock") or "–")
    return clock if clock == "device" else "WALL " + clock[len("wall "):] if clock.startswith("wall ") else clock


def table(rows: list[dict]) -> str:
    gpu = next((r for r in rows if r.get("gpu")), {})
    head = [f"GPU: {gpu.get('gpu', '?')}, driver {gpu.get('driver')}, torch {gpu.get('torch')}, "
            f"triton {gpu.get('triton')}, python {gpu.get('python')}", "",
            "harness ms is the device time per call (the kernel trace: per_call.device_ms) where the result has "
            "one, else the wall time per call, marked WALL with why; the wall time and its host share stand beside "
            "it. diff % is the harness figure against the profiler's; wall diff % the timed run's wall time "
            "against it.", ""]
    if gpu.get("gpu") == "cpu":
        head += ["NOT MEANINGFUL: no GPU. Harness times are the Triton interpreter's and the profiler's rows are "
                 "CPU ops; no agreement is judged.", ""]
    lines = ["| problem | status | clock | harness ms | profiler ms | diff % | wall ms | host share | wall diff % | "
             "re-run alone: harness / profiler / ncu ms | within 3% (>=50 us) | cause of a miss |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        t = r.get("rerun_alone") or (r if r.get("ncu_ms") is not None else None)
        third = "–" if t is None else (f"{fmt(t.get('harness_ms'), '.4f')} / {fmt(t.get('profiler_ms'), '.4f')} / "
                                       f"{fmt(t.get('ncu_ms'), '.4f')}")
        share = r.get("host_share")
        cause = miss_cause.line(r["cause"], rerun_text(r)) if r.get("cause") else "–"
        lines.append(f"| {r['problem']} | {r.get('status')} | {clock_cell(r) if r.get('status') != 'not run' else '–'} | "
                     f"{fmt(r.get('harness_ms'), '.4f')} | {fmt(r.get('profiler_ms'), '.4f')} | "
                     f"{fmt(r.get('diff_pct'), '+.1f')} | {fmt(r.get('wall_ms'), '.4f')} | "
                     f"{'–' if share is None else format(100 * share, '.1f') + '%'} | "
                     f"{fmt(r.get('wall_diff_pct'), '+.1f')} | {third} | {verdict(r)} | {cause} |")
    judged = [r for r in rows if r.get("meaningful") and r.get("within_pct") is not None]
    tail = [""]
    if judged:
        ok = sum(1 for r in judged if r["within_pct"])
        why = sum(1 for r in judged if explained(r))
        on_device = sum(1 for r in judged if r.get("harness_clock") == "device")
        tail.append(f"{ok} of {len(judged)} problems of 50 us or more agree within 3% ({on_device} judged on the "
                    f"device clock, {len(judged) - on_device} on the wall clock for want of one); of the "
                    f"{len(judged) - ok} misses, {why} explained by the other clocks (ncu agrees with the harness, or only the "
                    f"profiler's first reading moved alone) "
                    f"and {len(judged) - ok - why} unexplained by the clocks (each with its cause).")
    left = sum(1 for r in rows if r.get("status") == "not run")
    if left:
        tail.append(f"{left} problem(s) not run: the time cap (--max-minutes) was reached.")
    return "\n".join(head + lines + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("ours", "kernelbench", "both"), default="ours",
                        help="ours: benchmarks/level1 with benchmarks/solutions; kernelbench: KernelBench's "
                             "levels with benchmarks/kernelbench_solutions; both")
    parser.add_argument("--problems", help="a benchmark directory (with --solutions), instead of --suite")
    parser.add_argument("--solutions", help="its solutions, in bench's --candidates layout")
    parser.add_argument("--filter", help="glob over the label (ours/level1/5_softmax), the key or the stem")
    parser.add_argument("--max-minutes", type=float, default=7.0)
    parser.add_argument("--jobs", type=int, default=8,
                        help="problems in flight at once, each with its two evaluations submitted together; the "
                             "server admits as many evaluations (1: one after another)")
    parser.add_argument("--out", type=Path, help="JSON lines, one per problem, appended as measured")
    parser.add_argument("--summary", type=Path, help="write the Markdown table here too")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--isolation", default="auto")
    parser.add_argument("--third-clock", choices=("misses", "off"), default="misses",
                        help="misses: re-run each miss once alone (nothing else in flight) with the kernel "
                             "evidence's ncu run (the third clock), after the first pass; off: no re-run")
    parser.add_argument("--third-share", type=float, default=0.2,
                        help="the share of --max-minutes kept for the misses' re-runs alone (default 0.2)")
    parser.add_argument("--device-clock", choices=("trace", "off"), default="trace",
                        help="trace: on a GPU, the timed evaluation of each problem is traced (a profiled job "
                             "is not) and its device time per call is judged; off: its process is not traced "
                             "and it is judged on the wall clock, every row marked so")
    args = parser.parse_args(argv)
    if not 0 <= args.third_share < 1:
        parser.error("--third-share must be in [0, 1)")
    if not args.max_minutes > 0:
        parser.error("--max-minutes must be > 0")
    if not 1 <= args.jobs <= 64:
        parser.error("--jobs must be 1 to 64")
    todo, notes = pairs(args)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not todo:
        print("error: no problem with a solution was selected", file=sys.stderr)
        return 2
    from kernelagent.harness import Evaluator

    started = time.monotonic()
    cap = args.max_minutes * 60.0
    rows: list[dict | None] = [None] * len(todo)
    out = args.out.open("a") if args.out else None

    def write(row: dict) -> None:
        if out is not None:
            out.write(json.dumps(row) + "\n")
            out.flush()

    def run_pass(items: list[tuple[int, tuple[str, Path, Path]]], work, what: str, until: float,
                 jobs: int) -> list[int]:
        """Up to `jobs` evaluations in flight; a new one starts while the time spent plus the
        median evaluation so far (its wait included) stays within `until` seconds. The indices
        left are returned."""
        queue, pending, seconds = list(items), {}, []
        while queue or pending:
            while queue and len(pending) < jobs and not (
                    seconds and time.monotonic() - started + statistics.median(seconds) > until):
                i, item = queue.pop(0)
                pending[pool.submit(work, i, *item, in_flight=len(pending) + 1)] = i
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                row = future.result()
                seconds.append(row["seconds"])
                print(f"{what} {row.get('problem', todo[i][0])}: {row['status']} harness "
                      f"{fmt(row.get('harness_ms'), '.4f')} ms ({str(row.get('harness_clock', '?')).split(' ')[0]}), "
                      f"profiler {fmt(row.get('profiler_ms'), '.4f')} ms"
                      + (f", ncu {fmt(row.get('ncu_ms'), '.4f')} ms" if what == "re-run alone" else "")
                      + f" ({row['seconds']:.1f} s)", file=sys.stderr, flush=True)
        return [i for i, _ in queue]

    device = args.device_clock == "trace"

    def first(i: int, label: str, problem: Path, solution: Path, in_flight: int) -> dict:
        rows[i] = row = measure(evaluator, label, problem, solution, device=device, in_flight=in_flight)
        write(row)
        return row

    def second(i: int, label: str, problem: Path, solution: Path, in_flight: int) -> dict:
        row = rows[i]
        row["rerun_alone"] = rerun_alone(evaluator, row, problem, solution, device=device)
        write({"problem": label, "rerun_alone": row["rerun_alone"]})
        return dict(row["rerun_alone"], problem=label)

    try:
        with Evaluator(device=args.device, isolation=args.isolation, concurrency=args.jobs) as evaluator, \
                ThreadPoolExecutor(max_workers=args.jobs) as pool:
            # The first pass, every problem, without Nsight Compute (its runs are one at a time on
            # the host, ~5 s each of them); each miss is re-run alone, after, one at a time.
            reserve = cap * args.third_share if args.third_clock == "misses" else 0.0
            left = run_pass(list(enumerate(todo)), first, "first", cap - reserve, args.jobs)
            for i in left:
                rows[i] = {"problem": todo[i][0], "status": "not run"}
            if args.third_clock == "misses":
                misses = [(i, todo[i]) for i, r in enumerate(rows)
                          if r and r.get("meaningful") and r.get("within_pct") is False]
                for i in run_pass(misses, second, "re-run alone", cap, 1):
                    rows[i]["rerun_alone"] = {"status": "not run", "why": "time cap", "ncu_note": "time cap"}
            else:
                for r in rows:
                    if r and r.get("within_pct") is False:
                        r["rerun_alone"] = {"status": "not run", "why": "--third-clock off", "ncu_note": "off"}
    except KeyboardInterrupt:
        print("interrupted: the table below has what was measured", file=sys.stderr)
        rows = [r if r is not None else {"problem": todo[i][0], "status": "not run"} for i, r in enumerate(rows)]
    finally:
        for r in rows:  # every miss carries what it met (issue 58, scope 3)
            if r is not None and r.get("meaningful") and r.get("within_pct") is False:
                attach_cause(r)
                write({"problem": r["problem"], "cause": r["cause"]})
        if out is not None:
            out.close()
    text = table(rows)
    print(text)
    if args.summary:
        args.summary.write_text(text + "\n")
    print(f"wall: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

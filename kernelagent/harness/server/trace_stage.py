"""The job's side of the kernel trace (issue 55): the candidate's channel opened before its
process is forked, read while the job runs, collected once the process is gone.

Where the server's fingerprint names a tracer (trace/build.for_server: a CUDA device, the library
built), the candidate's process gets a pipe of its own (trace/channel.py) and so does the
reference's (its baselines timed under the same tracing as the candidate, and their device times
read from it after the baselines: `baseline_clock`, issue 58). The candidate's bytes
stay on the job (`job.trace`) for the trace's rules: trace/records.decode and trace/rules.judge,
the other half of issue 55, plug in at `collect`. Nothing happens where there is no tracer (the
CPU): the job's processes get the job's dict unchanged."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent import settings
from kernelagent.harness.trace import channel as trace_channel

if TYPE_CHECKING:
    from kernelagent.harness.server.seams import TraceJob

DUMP_ENV = "KERNELAGENT_TRACE_DUMP"  # a folder: each job's raw trace is written there as <job>.jsonl


def open_for(job: TraceJob) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the reference's job dict, the candidate's) for the fork, with their trace specs."""
    job.trace_channel, job.trace, job.trace_checks = None, None, 0
    job.ref_trace_channel = None
    library = (job.fingerprint.get("trace") or {}).get("library")
    if not library or job.config.profile or not job.config.trace:
        # An asked-for profile (`kernelagent profile`, EvalConfig.profile) runs torch.profiler in the
        # job's processes, which needs CUPTI to itself: such a job is not traced (no verdict of the
        # kernel evidence rests on it: profiling.py turns the evidence off).
        # A job the caller asked untraced (EvalConfig.trace, for measuring the tracer's cost) is
        # judged by Nsight Compute instead (server/evidence.ncu_planned: no trace to judge).
        return job.child_job, job.child_job
    # The candidate's copy lies in its own scratch, which its jail shows at the same path (the
    # cache the server built it in is hidden there); no candidate code runs before cuInit loads it.
    own = job.scratch / ".ka-trace" / Path(library).name
    own.parent.mkdir()
    shutil.copyfile(library, own)
    os.chmod(own, 0o555)
    job.trace_channel = trace_channel.open_channel()
    job.trace_channel.start()  # the reader; the server's write end is closed by `collect`
    # The reference's own pipe (issue 58): its baselines' device times (baseline_clock). Read until
    # the reference is gone (close_reference); the candidate's jail closes its copy of the write end.
    job.ref_trace_channel = trace_channel.open_channel()
    job.ref_trace_channel.start()
    return ({**job.child_job, "trace": job.ref_trace_channel.child_spec(library)},
            {**job.child_job, "trace": job.trace_channel.child_spec(str(own))})


def collect(job: TraceJob) -> None:
    """Once the candidate's process is gone: everything it wrote, and what the result says of it."""
    channel = getattr(job, "trace_channel", None)
    if channel is None:
        return
    job.trace_channel = None
    job.trace = channel.collect()
    job.facts.trace = {"bytes": job.trace.read_bytes, "overflow": job.trace.overflow, "ended": job.trace.ended}
    dump = settings.get(DUMP_ENV)
    if dump:  # the operator's own folder (probes, GPU tests, fixtures): the raw bytes, as they came
        name = "".join(c for c in str(job.job_id) if c.isalnum() or c in "-_")[:64] or "job"
        try:
            Path(dump).mkdir(parents=True, exist_ok=True)
            (Path(dump) / f"{name}.jsonl").write_bytes(job.trace.data)
        except OSError:
            pass


def close(job: TraceJob) -> None:
    """A job that will not run: both ends go unread."""
    channel = getattr(job, "trace_channel", None)
    if channel is not None:
        job.trace_channel = None
        channel.close()
    close_reference(job)


def close_reference(job: TraceJob) -> None:
    """Once the reference's process is gone (or will never run): its trace's pipe given back."""
    channel = getattr(job, "ref_trace_channel", None)
    if channel is not None:
        job.ref_trace_channel = None
        channel.close()


BASELINE_WAIT_S = 5.0  # for the reader to have the reference's flush after its baselines


def baseline_clock(channel: trace_channel.Channel | None, compile_modes: list[str], timings: dict[str, Any]) -> str:
    """Each freshly timed baseline's device time per call (trace/baseline_clock.device_ms), from
    the reference's own trace (`channel`: job.ref_trace_channel), into timings[name]["device_ms"]
    (finite and positive only). Returns '' or why none could be read ("no trace" where the
    reference was not traced)."""
    from kernelagent.harness.trace import baseline_clock as clock
    from kernelagent.harness.trace.marks import runner_names

    if channel is None:
        return "no trace"
    deadline = time.monotonic() + BASELINE_WAIT_S
    data, stopped = channel.snapshot()
    while clock.until_flush(data) is None and not stopped and time.monotonic() < deadline:
        time.sleep(0.01)  # the flush was written before the answer; the reader may not have it yet
        data, stopped = channel.snapshot()
    found, why = clock.device_ms(data, runner_names(list(compile_modes)))
    for name, ms in found.items():  # each finite and positive (device_ms keeps no other)
        if isinstance(timings.get(name), dict):
            timings[name]["device_ms"] = ms
    return why


def expected(job: TraceJob) -> Any:
    """What the trace's rules are told (trace/calls.Expected), from the server's own knowledge,
    never the candidate's: its own kernel names from its source, how many checks the server
    ordered (each one a CHECK marker pair, numbered from 0 in order), the timed loop as the server
    ran it (warm-ups: WARMUP pairs 0..w-1; timed calls: TIMED pairs across the segments) and the
    timed median per call the server checked. The trace's own first marker gives the marker
    stream and context."""
    from kernelagent.harness.cuda_source import static_own_names
    from kernelagent.harness.trace.calls import Expected

    loop = job.facts.timed_loop or {}
    timing = (job.facts.timings or {}).get("candidate") or {}
    warmups, timed = int(loop.get("warmup_calls") or 0), int(loop.get("calls") or 0)
    phases = {"first", "check"} | ({"warmup"} if warmups else set()) | ({"timed"} if timed else set())
    median = timing.get("median_ms")
    return Expected(own_names=frozenset(static_own_names(job.request.get("candidate_source", ""))),
                    checks=int(getattr(job, "trace_checks", 0)), timed=timed, warmups=warmups,
                    median_ms=float(median) if isinstance(median, (int, float)) and not isinstance(median, bool)
                    else None, phases=frozenset(phases))


def judge(job: TraceJob) -> dict[str, Any] | None:
    """The trace's verdict on a correct result (trace/rules.judge_bytes: the decoder, then the
    rules), as the evidence's `trace` entry: {"flags", "facts", "incomplete", "seconds"}; None
    where the job had no trace (no tracer: the CPU, `KERNELAGENT_TRACE=0`, a tracer that could not
    be built). Decoding and judging are pure functions of the bytes and the server's knowledge."""
    from kernelagent.harness.trace import rules

    trace = getattr(job, "trace", None)
    if trace is None:
        return None
    started = time.monotonic()
    if trace.overflow:
        verdict = rules.TraceVerdict(incomplete=f"the trace passed its bound of {trace_channel.CAP_BYTES} bytes ({trace.read_bytes} read)")
    else:
        verdict = rules.judge_bytes(trace.data, expected(job))
    facts = verdict.facts.to_dict()
    calls = facts.pop("calls", None) or ()  # per call: kept in the dump, not in every result
    for key in ("own_ns", "library_ns", "glue_ns"):  # the timed calls' sums (an audit compares them)
        facts[key] = sum(int(c.get(key) or 0) for c in calls)
    facts["timed_calls"] = len(calls)
    return {"flags": [dict(f) for f in verdict.flags], "facts": facts, "incomplete": verdict.incomplete,
            "seconds": round(time.monotonic() - started, 4)}

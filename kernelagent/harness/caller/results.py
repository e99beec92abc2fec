"""The caller's last word on a result: the server's raw result merged with the caller's own
fields and the baselines (cached or fresh, with their speedups and intervals), and the kernel
evidence judged against the candidate's source and checked timing. Pure functions of their
arguments and the baseline cache; no process is started here."""

from __future__ import annotations

import math
from typing import Any

from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import SEVERITY, EvalResult, Flag, Status, Timing


def apply_kernel_evidence(result: EvalResult, evidence: dict[str, Any] | None, candidate_source: str) -> None:
    """Out-of-process evidence for a correct CUDA result that nothing rejected (flagged for
    review or not: server/evidence.py says why): the kernels ncu
    saw (collected by the server as the job's last stage, server/evidence.py), judged here
    against the candidate's source and its checked timing (server/kernel_evidence.py). A
    reject flag turns the verdict into `rejected`; evidence that could not be collected is a
    review flag (the result is then no win). Nothing on the CPU, where no such evidence
    exists, and nothing for a result that is not correct (it would only cost time).

    Where the job was traced (issue 55), the trace's verdict comes first (`apply_trace`); ncu's
    report, when it ran as an audit or the trace's fallback, is judged after it, and an audit that
    sees clearly less of the candidate's own work than the trace said rejects the result
    (`audit_disagreement`)."""
    from kernelagent.harness.server import kernel_evidence
    from kernelagent.harness import verdict  # the verdict fold: the same rule as the server's

    if result.status != Status.CORRECT or not (result.fingerprint or {}).get("cuda"):
        return
    if any(f.severity == "reject" for f in result.flags):
        return
    if not isinstance(evidence, dict):
        evidence = {"unavailable": "the harness server did not run it"}
    result.kernel_evidence = {k: v for k, v in evidence.items() if k not in ("kernels", "trace")}
    if "seconds" in evidence:
        result.stage_seconds["evidence"] = float(evidence["seconds"])
    trace = evidence.get("trace")
    if isinstance(trace, dict):
        # The kernel trace of the job's own process (issue 55), judged by the server: its flags
        # stand first; where Nsight Compute ran too (an audit, or the trace's fallback), its own
        # rules and its agreement with the trace follow below.
        apply_trace(result, trace)
        if result.status != Status.CORRECT or evidence.get("source") == "trace":
            return
        audit = audit_disagreement(trace, evidence, kernel_evidence.static_own_names(candidate_source))
        if audit:
            _reject(result, [audit])
            if result.status != Status.CORRECT:
                return
        # Nsight Compute's own rules follow, as without a trace
    seen = kernel_evidence.violations_under_ncu(evidence)
    if seen:
        result.flags.extend(Flag(f["kind"], f["message"], f["severity"]) for f in seen)
        verdict.weigh(result, seen)
        return
    if "unavailable" in evidence or not isinstance(evidence.get("kernels"), list):
        why = evidence.get("unavailable", "no kernel list came back")
        result.flags.append(Flag("kernel-evidence", "not collected, so this result does not count as a win: "
                                 + str(why)[:400], SEVERITY["kernel-evidence"]))
        return
    result.kernel_evidence["kernels"] = [{"name": k["name"], "launches": k["launches"],
                                          "total_ns": k["total_ns"], "glue": kernel_evidence.is_glue(k)}
                                         for k in evidence["kernels"][:20]]
    # A third clock beside the harness's and torch.profiler's: ncu's gpu__time_duration of every
    # kernel of the profiled calls (caches flushed before each kernel, the device's clocks as they
    # are), summed per call (benchmarks/profiler_agreement.py explains clock gaps with it).
    total_ns = sum(float(k.get("total_ns") or 0.0) for k in evidence["kernels"] if isinstance(k, dict))
    if math.isfinite(total_ns) and total_ns > 0:
        result.kernel_evidence["per_call_ms"] = total_ns / 1e6 / kernel_evidence.CALLS
        result.kernel_evidence["calls"] = kernel_evidence.CALLS
    candidate = result.timings.get("candidate")
    found = kernel_evidence.judge(evidence, kernel_evidence.static_own_names(candidate_source),
                                  candidate.median_ms if candidate else None)
    result.flags.extend(Flag(f["kind"], f["message"], f["severity"]) for f in found)
    # Explicit evidence of an exploit outranks the comparison: the server's own rule.
    verdict.weigh(result, found)


def _reject(result: EvalResult, found: list[dict[str, str]]) -> None:
    """Flags added to the result, and its verdict from them by the server's own rule (an explicit
    rejection outranks the comparison)."""
    from kernelagent.harness import verdict  # the verdict fold: the same rule as the server's

    result.flags.extend(Flag(f["kind"], f["message"], f["severity"]) for f in found)
    verdict.weigh(result, found)


def apply_trace(result: EvalResult, trace: dict[str, Any]) -> None:
    """The trace's verdict (server/trace_stage.judge) into `result`: its flags (validated: a kind
    the severity table knows, its severity from that table), its facts under
    kernel_evidence["trace"], and the verdict they make. An incomplete trace decides nothing (the
    server ran Nsight Compute instead) and says why in an info flag."""
    flags = []
    for raw in trace.get("flags") or []:
        if isinstance(raw, dict) and raw.get("kind") in SEVERITY:
            kind = str(raw["kind"])
            severity = raw.get("severity") if raw.get("severity") in ("reject", "review", "info") else SEVERITY[kind]
            flags.append({"kind": kind, "severity": severity, "message": str(raw.get("message", ""))[:600]})
    facts = trace.get("facts") if isinstance(trace.get("facts"), dict) else {}
    result.kernel_evidence["trace"] = {"facts": facts, "incomplete": str(trace.get("incomplete") or "")[:300],
                                       "seconds": trace.get("seconds")}
    per_call = facts.get("kernel_ms_per_call")
    if isinstance(per_call, (int, float)) and not isinstance(per_call, bool) and math.isfinite(per_call):
        result.kernel_evidence["trace_ms_per_call"] = float(per_call)
    if trace.get("incomplete"):
        result.kernel_evidence.pop("trace_ms_per_call", None)  # a trace with holes measures nothing either
        result.flags.append(Flag("trace-incomplete", "the kernel trace could not decide ("
                                 + str(trace["incomplete"])[:300] + "); Nsight Compute's evidence stands instead",
                                 SEVERITY["trace-incomplete"]))
        return
    from kernelagent.harness.caller.clocks import apply_clocks

    apply_clocks(result)  # the device clock beside the wall clock (issue 58)
    _reject(result, flags)


# How far Nsight Compute's share of the candidate's own kernels may fall below the trace's before
# the audit disagrees: the two see the same kernels (ncu with its caches flushed per kernel, the
# trace as timed), so an honest kernel's shares differ by clock effects, not by tens of points.
AUDIT_SHARE_GAP = 0.25


def audit_disagreement(trace: dict[str, Any], evidence: dict[str, Any], own_names: set[str]) -> dict[str, str] | None:
    """A Nsight Compute audit that disagrees with the trace (issue 55): the trace said the
    candidate's own kernels did the work, and ncu, outside the process, saw a clearly smaller
    own share (work the trace did not see: CUPTI switched off around it, records forged). None
    where they agree or ncu saw nothing to compare."""
    facts = trace.get("facts") if isinstance(trace.get("facts"), dict) else {}
    own_ns, library_ns = facts.get("own_ns"), facts.get("library_ns")
    kernels = evidence.get("kernels")
    if not isinstance(kernels, list) or not all(isinstance(v, (int, float)) for v in (own_ns, library_ns)):
        return None
    from kernelagent.harness.server.kernel_evidence import split_kernels

    _, own_kernels, work_kernels = split_kernels(kernels, own_names)  # ncu's own rule's split
    own = sum(float(k["total_ns"]) for k in own_kernels)
    work = sum(float(k["total_ns"]) for k in work_kernels)
    if own + work <= 0 or own_ns + library_ns <= 0:
        return None
    ncu_share, trace_share = own / (own + work), own_ns / (own_ns + library_ns)
    if trace_share - ncu_share <= AUDIT_SHARE_GAP:
        return None
    return {"kind": "audit-mismatch", "severity": SEVERITY["audit-mismatch"],
            "message": f"Nsight Compute, outside the candidate's process, saw its own kernels take {ncu_share:.0%} of "
                       f"the work where its kernel trace said {trace_share:.0%}: work ran that the trace did not see"}


def store_baselines(cache: Any, cache_key: str, baselines: dict[str, Any], fingerprint: dict[str, Any],
                    problem_sha256: str, config: EvalConfig) -> bool:
    """The baselines' cache entry, from the trusted reference's timings; True once written.
    What was measured is cached even when one mode failed (a mode that cannot compile this
    problem fails the same way next time); otherwise every later evaluation would re-time all
    the baselines afresh, and `profile` and `submit` could divide by different ones. A failed
    setup (no eager time) is not cached."""
    timings = baselines.get("timings") if isinstance(baselines.get("timings"), dict) else {}
    errors = baselines.get("errors") if isinstance(baselines.get("errors"), dict) else {}
    if not (timings and "eager" in timings and "setup" not in errors and config.use_baseline_cache):
        return False
    cache.put(cache_key, {"timings": timings, "fingerprint": fingerprint, "problem_sha256": problem_sha256,
                          "errors": dict(errors)})
    return True


def merge(base: EvalResult, raw: dict[str, Any], cached: dict[str, Any] | None, cache_key: str,
          config: EvalConfig, cache: Any) -> EvalResult:
    data = base.to_dict()
    baselines = raw.pop("baselines", None)
    for key, value in raw.items():
        if value is not None or key in ("stage",):
            data[key] = value
    result = EvalResult.from_dict(data)
    # The caller's own stages (the wait for another evaluator's baselines, the round trip)
    # beside the server's.
    result.stage_seconds = {**base.stage_seconds, **(raw.get("stage_seconds") or {})}
    if result.status != Status.CORRECT or not config.timing or not config.baselines:
        return result
    if cached is not None:
        result.baselines_cached = True
        timings = cached["timings"]
        for name, error in (cached.get("errors") or {}).items():
            result.flags.append(Flag("baseline-error", f"{name} baseline failed (cached): {error[-400:]}", "info"))
    elif baselines is not None:
        timings = baselines.get("timings", {})
        for name, error in baselines.get("errors", {}).items():
            result.flags.append(Flag("baseline-error", f"{name} baseline failed: {error[-400:]}", "info"))
        for name, why in baselines.get("skipped", {}).items():
            result.flags.append(Flag("baseline-skipped", why, "info"))
        store_baselines(cache, cache_key, baselines, result.fingerprint, result.problem_sha256, config)
    else:
        timings = {}
    from kernelagent.harness import stats

    for name, t in timings.items():
        result.timings[name] = Timing.from_dict(t)
    if result.baselines_cached:  # fresh ones were flagged by the server; cached ones here
        from kernelagent.harness.result import launch_bound_flags

        result.flags += launch_bound_flags({k: result.timings[k] for k in timings if k in result.timings})
    candidate = result.timings.get("candidate")
    if any(f.kind == "impossible-speed" for f in result.flags):
        candidate = None  # a time the hardware cannot deliver is never a speedup
    if candidate and candidate.median_ms > 0:
        for name, t in result.timings.items():
            if name == "candidate":
                continue
            result.speedups[name] = t.median_ms / candidate.median_ms
            interval = stats.trusted_speedup_interval(t.samples_ms, candidate.samples_ms,
                                                      candidate.server_segments_ms, candidate.source,
                                                      result.speedups[name])
            if interval is not None:
                result.speedup_intervals[name] = interval
    return result


FIRST_TRY_REASON_CHARS = 300
FIRST_TRY_STACK_CHARS = 3000  # the start's last stack dump, kept with a first try


def first_try_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What a job's first try beside others met, for the result of its re-run alone
    (concurrency.first_try): its status, the stage it ended in, the reason (cut to
    FIRST_TRY_REASON_CHARS, terminal sequences removed; the reason can quote the candidate's
    output), its stage clocks and waits (finite, non-negative numbers only) and, where a stage
    ran past its limit, its processes' states then (`at_limit`)."""
    from kernelagent.text import clean_text

    def numbers(field: str) -> dict[str, float]:  # the finite, non-negative numbers of a dict field
        value = result.get(field) if isinstance(result.get(field), dict) else {}
        return {str(k)[:40]: round(float(v), 3) for k, v in value.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0}

    concurrency = result.get("concurrency") if isinstance(result.get("concurrency"), dict) else {}
    at_limit = concurrency.get("at_limit") if isinstance(concurrency.get("at_limit"), dict) else {}
    states = {side: [clean_text(line)[:160] for line in at_limit.get(side, [])[:12] if isinstance(line, str)]
              for side in ("candidate", "reference") if isinstance(at_limit.get(side), list)}
    summary = {"status": clean_text(result.get("status", ""))[:40], "stage": clean_text(result.get("stage", ""))[:40],
               "reason": clean_text(result.get("reason", ""))[:FIRST_TRY_REASON_CHARS],
               "stage_seconds": numbers("stage_seconds"), "concurrency": numbers("concurrency")}
    stack = at_limit.get("candidate_stack")
    if isinstance(stack, str) and stack:  # a start past its limit: where our code was (server/processes.py)
        states["candidate_stack"] = clean_text(stack)[:FIRST_TRY_STACK_CHARS]
    if states:  # what the job's processes were doing when a stage ran past its limit (server/job.py)
        summary["at_limit"] = states
    return summary

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
    against the candidate's source and its checked timing (caller/kernel_evidence.py). A
    reject flag turns the verdict into `rejected`; evidence that could not be collected is a
    review flag (the result is then no win). Nothing on the CPU, where no such evidence
    exists, and nothing for a result that is not correct (it would only cost time)."""
    from kernelagent.harness.caller import kernel_evidence
    from kernelagent.harness.server import verdict  # pure functions: the same rule in this process

    if result.status != Status.CORRECT or not (result.fingerprint or {}).get("cuda"):
        return
    if any(f.severity == "reject" for f in result.flags):
        return
    if not isinstance(evidence, dict):
        evidence = {"unavailable": "the harness server did not run it"}
    result.kernel_evidence = {k: v for k, v in evidence.items() if k != "kernels"}
    if "seconds" in evidence:
        result.stage_seconds["evidence"] = float(evidence["seconds"])
    seen = kernel_evidence.violations_under_ncu(evidence)
    if seen:
        result.flags.extend(Flag(f["kind"], f["message"], f["severity"]) for f in seen)
        outcome = verdict.apply_rejects(verdict.Outcome(result.status, result.reason, result.stage), seen)
        result.status, result.reason, result.stage = outcome.status, outcome.reason, outcome.stage
        result.correct = outcome.correct
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
    outcome = verdict.apply_rejects(verdict.Outcome(result.status, result.reason, result.stage), found)
    result.status, result.reason, result.stage = outcome.status, outcome.reason, outcome.stage
    result.correct = outcome.correct


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

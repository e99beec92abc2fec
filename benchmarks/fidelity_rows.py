"""The rows of benchmarks/fidelity.py: one JSON row per evaluation, from a result's JSON (the
candidate's time and samples, the speedups on the wall and the device clock, where the time went,
what running beside others cost it). fidelity.py's docstring says what each field is."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Pair:
    """A problem and the candidate evaluated against it, with its size overrides."""

    label: str
    problem: Path
    candidate: Path
    overrides: dict[str, int | float] = field(default_factory=dict)


def quarter_drift(samples: list[float]) -> float | None:
    """Median of the last quarter of the samples over that of the first quarter."""
    q = len(samples) // 4
    if q < 1:
        return None
    first = statistics.median(samples[:q])
    return statistics.median(samples[-q:]) / first if first > 0 else None


# What a row keeps of the result's `concurrency` (harness/server/gate.py and job.py).
CONCURRENCY_KEYS = ("shared_device", "alone", "retried_alone", "first_try_alloc_retries", "first_try", "wait_s",
                    "memory_wait_s", "device_lock_wait_s", "idle_wait_s", "bandwidth_wait_s", "bandwidth_busy",
                    "held_s", "slot_freeze_s", "slot_calibration_s", "slot_loop_s", "estimate_s", "estimate_error",
                    "fork_wait_s", "copy_us", "alloc_retries")


def make_row(pair: Pair, cache: str, rep: int, prime: bool, rc: int, data: dict | None, stderr: str,
             wall: float, clocks_before: dict | None, clocks_after: dict | None, run_id: str,
             process: str = "fresh", in_flight: int | None = None) -> dict:
    row = {"run_id": run_id, "label": pair.label, "problem": str(pair.problem), "candidate": str(pair.candidate),
           "overrides": pair.overrides, "cache": cache, "rep": rep, "prime": prime, "rc": rc, "process": process,
           "wall_s": round(wall, 3), "clocks_before": clocks_before, "clocks_after": clocks_after,
           "in_flight": in_flight, "rerun_alone": rep == 0 and not prime}
    if data is None:
        row.update(status="no-result", reason=stderr.strip().splitlines()[-1] if stderr.strip() else "no JSON",
                   stderr_tail=stderr)
        return row
    timings = data.get("timings", {})
    cand = timings.get("candidate", {})
    samples = [float(x) for x in cand.get("samples_ms", []) if isinstance(x, (int, float))]
    loop = data.get("timed_loop", {}) or {}
    server, claimed = loop.get("server_ms_per_call"), loop.get("claimed_mean_ms")
    fp = data.get("fingerprint", {}) or {}
    row.update(
        status=data.get("status"), reason=data.get("reason", ""), device=data.get("device"),
        meaningful=cand.get("meaningful", timings.get("eager", {}).get("meaningful")),
        timing_note=cand.get("note", ""),
        baselines_cached=data.get("baselines_cached"),
        candidate_ms=cand.get("median_ms"), eager_ms=timings.get("eager", {}).get("median_ms"),
        compile_ms=timings.get("compile", {}).get("median_ms"),
        speedup_eager=data.get("speedups", {}).get("eager"), speedup_compile=data.get("speedups", {}).get("compile"),
        interval_eager=data.get("speedup_intervals", {}).get("eager"),
        interval_compile=data.get("speedup_intervals", {}).get("compile"),
        n_samples=len(samples), drift_q4_q1=quarter_drift(samples), source=cand.get("source"),
        timed_loop={"server_ms_per_call": server, "claimed_mean_ms": claimed,
                    "ratio": server / claimed if server and claimed else None,
                    "calls": loop.get("calls"), "source": loop.get("source"),
                    **{k: loop.get(k) for k in LOOP_KEYS if k in loop}},
        # What kept a correct repetition from counting (a flag of review or reject), for its line.
        passed=data.get("passed"), flags=result_flags(data),
        fingerprint={k: fp.get(k) for k in ("gpu_name", "torch", "torch_cuda", "triton", "python", "device")},
        problem_sha256=data.get("problem_sha256"),
        # Where the wall time went, for the slow cold primes (150-213 s beside 11-25 s on an H100,
        # 2026-11-27): the harness's stage clocks and what sharing the device cost.
        stage_seconds={k: round(float(v), 3) for k, v in (data.get("stage_seconds") or {}).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)},
        concurrency={k: v for k, v in (data.get("concurrency") or {}).items() if k in CONCURRENCY_KEYS},
        # The device clock (issue 58): the candidate's device and wall time per call with its host
        # share, the speedups on the device clock, the SM clock over its loop (for a miss's cause).
        clocks_mhz=cand.get("clocks_mhz") or None,
        **device_figures(data),
    )
    if data.get("status") != "correct":
        row["stderr_tail"] = stderr
    return row


# What a row keeps of the result's `timed_loop` beside the clocks' ratio (server/timed.py).
LOOP_KEYS = ("segments", "calibration_s", "server_loop_s", "calibration_reused", "calibration_shared")


def result_flags(data: dict) -> list[dict]:
    """The result's flags, kind and severity each with the first 200 characters of its message."""
    flags = data.get("flags") if isinstance(data.get("flags"), list) else []
    return [{"kind": str(f.get("kind"))[:40], "severity": str(f.get("severity"))[:10],
             "message": str(f.get("message", ""))[:200]} for f in flags[:20] if isinstance(f, dict)]


def failure_line(row: dict) -> str:
    """Why a repetition has no correct timed result: its status and reason, and where the status
    was correct, the flags (not info) that kept it from passing."""
    line = f"rep {row['rep']}: {row.get('status')}"
    if row.get("reason"):
        line += f": {str(row['reason'])[:160]}"
    held = [f for f in row.get("flags") or [] if f.get("severity") != "info"]
    if held:
        line += "; " + "; ".join(f"{f['kind']} ({f['severity']}): {f['message'][:160]}" for f in held)
    elif row.get("status") == "correct":
        line += "; no speedup recorded" + (" (not passed)" if row.get("passed") is False else "")
    return line


def device_figures(data: dict) -> dict:
    """per_call and speedups_device of a result's JSON, validated (a figure that is not a finite
    positive number is None: not recorded)."""
    def ms(value, positive: bool = True):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and (value > 0 if positive else value >= 0)
        return float(value) if ok else None

    per_call = data.get("per_call") if isinstance(data.get("per_call"), dict) else {}
    device = data.get("speedups_device") if isinstance(data.get("speedups_device"), dict) else {}
    clock = {"device_ms": ms(per_call.get("device_ms"), False), "wall_ms": ms(per_call.get("wall_ms")),
             "host_share": ms(per_call.get("host_share"), False), "source": per_call.get("source")}
    return {"per_call": clock if clock["device_ms"] is not None and clock["wall_ms"] is not None else None,
            "candidate_device_ms": clock["device_ms"], "host_share": clock["host_share"],
            "speedup_compile_device": ms(device.get("compile")), "speedup_eager_device": ms(device.get("eager"))}

"""The verdict of one evaluation, as plain data (JSON in, JSON out)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 2

# Severity of each flag kind, in one place (the threat table is in child/defences.py). The server
# assigns severities from this table: a severity claimed by the candidate's process is ignored.
SEVERITY: dict[str, str] = {
    "no-custom-kernel": "reject",
    "fallback-to-reference": "reject",
    "hidden-work": "reject",
    "output-caching": "reject",
    "timer-escape": "review",
    "tampering": "reject",
    "numeric-modes": "reject",
    "input-mutation": "reject",
    "output-alias": "reject",
    "output-type": "reject",
    "reading-reference": "reject",
    "input-distribution": "info",
    "shape-specialisation": "review",
    "sandbox-escape": "reject",
    "impossible-speed": "review",
    "threads": "info",
    "numeric-modes-info": "info",
    "no-custom-kernel-info": "info",
    "roofline": "info",
    "wrong-backend": "reject",
    "protocol": "reject",  # the candidate's process broke the protocol (forged or malformed messages)
    # a fault of ours, or the reference's, after the candidate had failed a check: its failure stands
    "later-fault": "info",
    "clock-mismatch": "review",  # its in-process timings disagree with the server's clock
    # its median sat under what the server's segments allow, not grossly: the server's times are reported
    "clock-median": "info",
    # PyTorch did work that a candidate's own kernels should do, where that is allowed
    # (EvalConfig.torch_work="allow": a whole model's end-to-end check)
    "torch-work": "info",
    "isolation": "info",
    # Why the out-of-process kernel evidence could not be collected for a would-be win: without
    # it nothing outside the candidate's process saw who did the work, so it is not a win.
    "kernel-evidence": "review",
    # Timer traps (child/timing.py). All "info": they describe the machine, not the candidate, and
    # "review" would stop a correct kernel from counting for a condition it did not cause. The
    # result says so, so that a person (or the fidelity benchmark) can discount the numbers.
    "throttling": "info",  # the SM clock dropped > 10% over a timed loop (first vs last decile)
    "l2-flush": "info",  # the L2 flush did not measurably evict on this device: times are warm-L2
    "l2-reset": "info",  # the persisting-L2 state could not be reset (driver symbol missing or failing)
    "launch-bound": "info",  # a baseline's call is under 2x its own empty call: launch overhead dominates
    # the memory bandwidth still read loud after the wait before a timed loop (server/gate.Bandwidth)
    "bandwidth-busy": "info",
    # The kernel trace of the job's own process (issue 55, harness/trace/rules.py). A trace
    # switched off, cut short or written into by the candidate is a rejection, never a pass; one
    # with holes (records dropped, past the caps) decides nothing and the evidence falls back to
    # Nsight Compute, so it is only noted.
    "trace-missing": "reject",
    "trace-forged": "reject",
    "trace-incomplete": "info",
    "idle-call": "reject",  # a timed call ran no device work while the checks ran kernels
    "launch-mismatch": "reject",  # timed calls launched other own kernels than each other or the checks
    "outside-interval": "reject",  # work ran past its timed call, or between the timed calls
    "other-context": "reject",  # work in a CUDA context other than the harness's markers'
    # the traced busy time far below the checked median ("review" where not gross: rules.py)
    "untraced-work": "reject",
    # a Nsight Compute audit saw clearly less of the candidate's own work than its trace said
    # (caller/results.py audit_disagreement)
    "audit-mismatch": "reject",
}

# A loop whose SM clock fell by more than this share (first vs last decile) is flagged `throttling`.
THROTTLE_DROP = 0.10
# A baseline whose median is under this many times its own empty call is flagged `launch-bound`.
LAUNCH_BOUND_FACTOR = 2.0


class Status:
    """Why an evaluation ended. Strings, so that JSON stays readable."""

    CORRECT = "correct"  # every trial passed (timing may still have been skipped)
    COMPILED = "compiled"  # compile-only evaluation: loaded and ran its first call (or, for a
    # CUDA candidate on a machine without a GPU: its sources compiled with nvcc, nothing ran)
    INCORRECT = "incorrect"  # ran, but an output did not match the reference
    COMPILE_ERROR = "compile_error"  # syntax error or too deep to parse, import error, no ModelNew, first call failed
    RUNTIME_ERROR = "runtime_error"  # raised during a correctness trial or timing
    TIMEOUT = "timeout"  # a stage ran past its hard limit; the process group was killed
    CRASHED = "crashed"  # the candidate's process died (signal, os._exit, CUDA fault)
    REJECTED = "rejected"  # caught cheating: mutated inputs, bad outputs, banned code
    BAD_PROBLEM = "bad_problem"  # the problem file itself is broken (user error, exit 2)
    HARNESS_ERROR = "harness_error"  # our fault or the machine's, as our processes saw it, never as a candidate said
    # The problem does not fit this machine (its inputs, by an estimate made before anything is
    # allocated, need more memory than there is): a verdict about the machine, never the
    # candidate. The reason gives the bytes needed and available; `memory` holds them too
    # (needed_bytes, available_bytes). bench skips the problem, the RL reward is None.
    TOO_LARGE = "too_large"

    PASSING = (CORRECT,)
    # Not a verdict on the candidate: the machine or the harness could not judge it.
    NOT_JUDGED = (HARNESS_ERROR, BAD_PROBLEM, TOO_LARGE)


@dataclass
class TrialResult:
    name: str  # "trial 0", "signed-normal", "extra[1]", "post-timing"
    seed: int
    passed: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_l2_err: float | None = None
    message: str = ""  # empty when passed; otherwise what a model can act on
    # which relative L2 rule judged the check: against the reference run in float64, with the
    # reference's own error and the limit, or without one and why (harness/child/compare.py)
    precision: str = ""
    # The server's clock on this check, in seconds: "candidate" (the seed sent to the outputs
    # described: its inputs generated, its call, the hand-over), "relay" (byte payloads read; 0
    # where CUDA IPC handles cross) and "reference" (its inputs, its run and the float64 run, the
    # comparison). Where a correctness stage's time goes (benchmarks/README.md).
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class Timing:
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    reps: int
    meaningful: bool = True  # False on the CPU / Triton interpreter
    note: str = ""
    # The per-call samples behind the quantiles (for confidence intervals), and where the
    # numbers come from: "in-process" (checked against the server's clock) or "server".
    samples_ms: list[float] = field(default_factory=list)
    source: str = "in-process"
    # SM clock (MHz, NVML) over the loop: [mean of the first decile, mean of the last]; empty
    # without NVML.
    clocks_mhz: list[float] = field(default_factory=list)
    # Baselines only: the same runner's time for an empty call (one tiny op on a 1-element
    # tensor, the same torch.compile mode), timed by the same timer: its per-call overhead.
    empty_call_ms: float | None = None
    # Baselines only: the median timed call's summed kernel time on the device's clock, read from
    # the reference process's kernel trace (issue 58; server/baselines.py); None where untraced.
    device_ms: float | None = None
    # The candidate only: the server's own time per call in each segment of the timed loop (its
    # clock, the calibration's share off). The speedup interval is never narrower than these allow.
    server_segments_ms: list[float] = field(default_factory=list)

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Timing":
        """From a result's or the cache's JSON: derived (iqr_ms) and unknown keys are dropped."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in data.items() if k in fields}
        if "device_ms" in kept:  # from the cache or a trace: finite and positive, else not there
            kept["device_ms"] = ms_or_none(kept["device_ms"], positive=True)
        return cls(**kept)


@dataclass
class Flag:
    """Something the harness noticed. `kind` names the check or exploit class.

    severity: "info" (reported only), "review" (suspicious: not counted as a pass until a
    person looks), "reject" (the candidate is rejected).
    """

    kind: str
    message: str
    severity: str = "info"


def ms_or_none(value: object, *, positive: bool) -> float | None:
    """A time in ms from JSON: a finite float (> 0, or >= 0 where not `positive`), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        return None
    return value


@dataclass
class CallClock:
    """The candidate's two figures per call (issue 58, docs/concepts/timing.md "Two clocks"):
    `device_ms`, the median timed call's summed kernel time on the device's clock (the kernel
    trace, trace/rules.TraceFacts.kernel_ms_per_call); `wall_ms`, the checked median per call
    (timings["candidate"].median_ms: start event to end event, the host's launches included);
    `host_share`, (wall - device) / wall clamped to [0, 1]: the share of the wall time the
    device ran none of the call's kernels (launches, Python, gaps). `source` names where
    device_ms comes from."""

    device_ms: float
    wall_ms: float
    host_share: float
    source: str = "trace"

    @classmethod
    def of(cls, *, device_ms: object, wall_ms: object, source: str = "trace") -> "CallClock | None":
        """Both figures validated (finite; the device's >= 0, the wall's > 0), else None."""
        device, wall = ms_or_none(device_ms, positive=False), ms_or_none(wall_ms, positive=True)
        if device is None or wall is None:
            return None
        return cls(device_ms=device, wall_ms=wall, host_share=min(max((wall - device) / wall, 0.0), 1.0),
                   source=str(source)[:40])

    @classmethod
    def from_dict(cls, data: object) -> "CallClock | None":
        """From a result's JSON: recomputed from its two figures (a stored share is not believed)."""
        if not isinstance(data, dict):
            return None
        return cls.of(device_ms=data.get("device_ms"), wall_ms=data.get("wall_ms"),
                      source=str(data.get("source") or "trace"))


def baseline_numerics() -> dict[str, Any]:
    """What every baseline (and the reference) is computed with, stated in each result: full fp32,
    no TF32 (child/common.py clean_numeric_modes sets these in the reference process before any
    baseline is built or timed)."""
    return {"tf32": False, "float32_matmul_precision": "highest",
            "note": "TF32 is off in every baseline (eager and each torch.compile mode) and in the reference: "
                    "torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False, "
                    "float32 matmul precision 'highest'"}


@dataclass
class EvalResult:
    status: str
    reason: str = ""  # one or two lines, actionable
    compiled: bool = False
    correct: bool = False
    stage: str | None = None  # the stage that ended it ("load", "compile", ...); None when done
    trials: list[TrialResult] = field(default_factory=list)
    timings: dict[str, Timing] = field(default_factory=dict)  # "candidate", "eager", "compile", ...
    speedups: dict[str, float] = field(default_factory=dict)  # baseline name -> t_base / t
    # The clock `speedups` (and speedup_intervals) are computed on: "wall" (the checked medians,
    # start event to end event, host launches included: candidate and baselines alike).
    speedup_clock: str = "wall"
    # The same ratios on the device clock (issue 58): baseline name -> the baseline's device time
    # per call / the candidate's (CallClock.device_ms), where both were traced. Empty otherwise.
    speedups_device: dict[str, float] = field(default_factory=dict)
    # The candidate's device and wall time per call and its host share (CallClock); None where
    # no kernel trace was read (the CPU, an untraced job, a trace that decided nothing).
    per_call: CallClock | None = None
    flags: list[Flag] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # Top kernels from torch.profiler when profiling was asked for:
    # [{"name", "total_ms", "calls", "share"}], largest first.
    kernels: list[dict[str, Any]] = field(default_factory=list)
    # What one call of the problem moves and computes (for roofline fractions): input_bytes,
    # output_bytes, param_bytes, flops (None without get_flops), dtype. Empty when unknown.
    workload: dict[str, Any] = field(default_factory=dict)
    # Confidence interval of each speedup (baseline name -> [low, high]), from the timing samples
    # (harness/stats.py). Decisions that must not be fooled by noise use the low end.
    speedup_intervals: dict[str, list[float]] = field(default_factory=dict)
    # Out-of-process kernel evidence (config.kernel_evidence; server/kernel_evidence.py): the
    # kernels Nsight Compute saw ({"kernels": [{name, launches, total_ns}], "seconds"}) or
    # {"unavailable": why}. Empty when not asked for.
    kernel_evidence: dict[str, Any] = field(default_factory=dict)
    # Bytes the problem moves (io_bytes = inputs + outputs of one call) and the peak device memory
    # of each process (peak_reference_bytes, peak_candidate_bytes; the latter is the candidate's
    # claim). Empty on the CPU where no peak is measured.
    memory: dict[str, Any] = field(default_factory=dict)
    # The timed loop as the server ran it: calls, kept outputs, its own clock, the source of the time.
    timed_loop: dict[str, Any] = field(default_factory=dict)
    baselines_cached: bool = False
    # Running beside other jobs on one device (server/gate.py): the timing slot's wait and hold
    # seconds ("wait_s", "held_s", "idle_wait_s"), its hold intervals ("held", epoch seconds),
    # whether the job shared the device, and whether it was re-run alone after running out of
    # memory beside others ("retried_alone").
    concurrency: dict[str, Any] = field(default_factory=dict)
    # The candidate process's kernel trace (issue 55) as the server read it: "bytes", "overflow"
    # (past the channel's bound: incomplete), "ended" (its writer closed); empty where no tracer ran.
    trace: dict[str, Any] = field(default_factory=dict)
    # The numeric modes the baselines were timed in (baseline_numerics(): TF32 off in every one).
    numerics: dict[str, Any] = field(default_factory=baseline_numerics)
    # "main"; "smoke" when the problem's own small CPU inputs (get_smoke_inputs) were used;
    # "derived-smoke" when, on the CPU, the whole job ran on the problem with its size constants
    # shrunk (harness/derive/), since the problem has no smoke inputs of its own.
    input_set: str = "main"
    # What harness/derive/ derived for a problem without get_extra_inputs / get_smoke_inputs:
    # {"smoke": {name: value} | None (the derived-smoke overrides), "main": {name: value} (the
    # values they replaced), "sets": [{"name", "kind", "overrides", "main"}] (derived check sets),
    # "skipped": [{"name", "reason"}] (sets the reference itself could not run), "note": str}.
    # Empty when nothing was derived.
    derived: dict[str, Any] = field(default_factory=dict)
    device: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    isolation: dict[str, Any] = field(default_factory=dict)
    seeds: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    problem: str = ""
    problem_sha256: str = ""
    candidate_sha256: str = ""
    log: str = ""  # the candidate process's output and any traceback (tail)
    format_version: int = FORMAT_VERSION

    @property
    def passed(self) -> bool:
        """Correct, and nothing flagged for review or rejection: counts as a win."""
        return self.status == Status.CORRECT and not any(
            f.severity in ("review", "reject") for f in self.flags)

    @property
    def baseline_overhead_ms(self) -> dict[str, float]:
        """Each baseline's empty-call time (its per-call overhead), from its Timing; in the JSON
        as `baseline_overhead_ms` (derived, so it also comes with cached baselines)."""
        return {name: t.empty_call_ms for name, t in self.timings.items()
                if name != "candidate" and t.empty_call_ms is not None}

    @property
    def speedup_eager(self) -> float | None:
        return self.speedups.get("eager")

    @property
    def speedup_compile(self) -> float | None:
        return self.speedups.get("compile")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name, timing in self.timings.items():
            data["timings"][name]["iqr_ms"] = timing.iqr_ms
        data["baseline_overhead_ms"] = self.baseline_overhead_ms
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EvalResult":
        from kernelagent.text import clean_tree

        # Reasons, logs, flag and trial messages carry text the candidate wrote: no escape
        # sequence or unencodable character of it reaches a terminal, a report or a model.
        data = clean_tree(dict(data))
        data["trials"] = [TrialResult(**t) for t in data.get("trials", [])]
        data["timings"] = {
            k: Timing.from_dict(t)
            for k, t in data.get("timings", {}).items()
        }
        data["flags"] = [Flag(**f) for f in data.get("flags", [])]
        data["per_call"] = CallClock.from_dict(data.get("per_call"))
        device = data.get("speedups_device") if isinstance(data.get("speedups_device"), dict) else {}
        data["speedups_device"] = {str(k): float(v) for k, v in device.items() if ms_or_none(v, positive=True) is not None}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def feedback(self) -> str:
        """A compact account of the verdict, for a model to act on."""
        lines = [f"status: {self.status}" + (f" (stage: {self.stage})" if self.stage else "")]
        if self.input_set != "main":
            smoke = (self.derived or {}).get("smoke") or {}
            sizes = ", ".join(f"{k}={tuple(v) if isinstance(v, list) else v}" for k, v in smoke.items())
            lines.append(f"inputs: {self.input_set}" + (f" ({sizes}; the main sizes are too large for the CPU)"
                                                         if sizes else ""))
        if self.reason:
            lines.append(f"reason: {self.reason}")
        failed = [t for t in self.trials if not t.passed]
        if self.trials:
            passed = sum(t.passed for t in self.trials)
            lines.append(f"correctness: {passed}/{len(self.trials)} checks passed")
        for trial in failed[:2]:
            lines.append(f"  {trial.name} (seed {trial.seed}): {trial.message}")
        for name, timing in self.timings.items():
            label = "" if timing.meaningful else " [not meaningful: CPU/interpreter]"
            empty = f", empty call {timing.empty_call_ms:.4f} ms" if timing.empty_call_ms is not None else ""
            lines.append(
                f"time {name}: median {timing.median_ms:.4f} ms, IQR {timing.iqr_ms:.4f} ms, "
                f"{timing.reps} reps{empty}{label}"
            )
        meaningful = all(t.meaningful for t in self.timings.values())
        for name, value in self.speedups.items():
            lines.append(f"speedup vs {name}: {value:.3f}x" + ("" if meaningful else " [not meaningful]"))
        for flag in self.flags:
            label = {"reject": "REJECTED", "review": "FLAGGED FOR REVIEW"}.get(flag.severity, "note")
            lines.append(f"{label} [{flag.kind}]: {flag.message}")
        return "\n".join(lines)


def decile_medians(samples_ms: list[float] | None) -> list[float] | None:
    """[median of the first tenth, median of the last tenth] of a loop's per-call times, in call
    order (at least one call each); None with fewer than 10 calls."""
    if not samples_ms or len(samples_ms) < 10:
        return None
    n = max(len(samples_ms) // 10, 1)

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    return [median(list(samples_ms[:n])), median(list(samples_ms[-n:]))]


def throttling_flag(loop: str, clocks_mhz: list[float] | None, samples_ms: list[float] | None = None) -> Flag | None:
    """`throttling` when the SM clock of `loop` fell by more than THROTTLE_DROP from the first
    decile of the loop to the last (clocks_mhz = [first, last]); None otherwise or unknown. The
    message gives the per-call times of the same deciles when `samples_ms` are there."""
    if not clocks_mhz or len(clocks_mhz) != 2 or not all(isinstance(c, (int, float)) for c in clocks_mhz):
        return None
    first, last = float(clocks_mhz[0]), float(clocks_mhz[1])
    if first <= 0 or last >= (1 - THROTTLE_DROP) * first:
        return None
    times = decile_medians(samples_ms)
    calls = f" (median call {times[0]:.4f} ms in the first tenth, {times[1]:.4f} ms in the last)" if times else ""
    return Flag("throttling",
                f"the SM clock fell from {first:.0f} MHz to {last:.0f} MHz ({100 * (1 - last / first):.0f}% lower) "
                f"between the first and the last tenth of the {loop} timed loop{calls}: the GPU throttled (heat "
                "or power), so the later calls ran slower and the time is not repeatable", SEVERITY["throttling"])


def launch_bound_flags(timings: dict[str, Timing]) -> list[Flag]:
    """`launch-bound` for each meaningful baseline whose median is under LAUNCH_BOUND_FACTOR
    times its own empty call: most of that baseline's time is per-call overhead, so a speedup
    against it mostly measures launch overhead, not a faster kernel."""
    flags = []
    for name, t in timings.items():
        if name == "candidate" or not t.meaningful or not t.empty_call_ms or t.empty_call_ms <= 0:
            continue
        if t.median_ms < LAUNCH_BOUND_FACTOR * t.empty_call_ms:
            flags.append(Flag(
                "launch-bound",
                f"the {name} baseline takes {t.median_ms:.4f} ms per call and an empty call of the same kind "
                f"{t.empty_call_ms:.4f} ms: it is launch-bound, so the speedup vs {name} comes mostly from "
                "launch overhead, not from faster kernels", SEVERITY["launch-bound"]))
    return flags

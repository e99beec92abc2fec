"""`kernelagent verify`: re-check every kernel of a manifest with the trusted harness.

A kernel fails when
- its verdict does not pass (incorrect, failed, rejected, or flagged for review);
- its problem changed since the lock (the kernel was verified against another problem);
- its speedup's lower bound is below its target (on a GPU), or its speedup regressed
  against the lock's by more than its tolerance on the same GPU model.
A kernel with no lock entry is new: it is recorded in the lock, and not failed for that.

Results come from the bench store (kernelagent/bench/store.py): an evaluation is stored
under the hash of problem, kernel, harness settings and environment, so a second verify of
an unchanged repository on an unchanged machine evaluates nothing.

Without a GPU the kernels run under the Triton interpreter on the problems' smoke inputs:
correctness is checked in full, speed is not (timing and baselines are skipped, and every
report says so); the verdict then rests on correctness and the lock's problem hashes.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent.ci.lock import merge_entry, read_lock, today, write_lock
from kernelagent.ci.manifest import KernelEntry, Manifest

if TYPE_CHECKING:
    from kernelagent.problem import Problem
    from kernelagent.harness import EvalConfig, EvalResult, FingerprintedEvaluator

# The baseline a target is measured against: TorchInductor where it was timed, else eager.
BASELINE_NAMES = {"compile": "TorchInductor", "eager": "eager"}


class CachedEvaluator:
    """An Evaluator seen through the bench store: `evaluate` answers from the store when the
    same problem, candidate, settings and environment were evaluated before, and stores
    what it evaluates. It has the `evaluate`/`fingerprint` pair the agent needs too."""

    def __init__(self, evaluator: FingerprintedEvaluator, store: Any, run_id: str) -> None:
        self.evaluator, self.store, self.run_id = evaluator, store, run_id
        self.performed = 0
        self.reused = 0
        self._fingerprint: dict[str, Any] | None = None
        self._count_lock = threading.Lock()  # verify evaluates several kernels at once

    @property
    def jobs(self) -> int:
        """Evaluations the harness runs at once on this device (its server's admission)."""
        self.fingerprint()
        concurrency = getattr(self.evaluator, "concurrency", None)
        return max(1, int((concurrency or {}).get("jobs") or 1)) if isinstance(concurrency, dict) else 1

    def fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            self._fingerprint = self.evaluator.fingerprint()
        return dict(self._fingerprint)

    @property
    def cpu(self) -> bool:
        return not self.fingerprint().get("cuda")

    def evaluate(self, problem: Problem | str | Path, candidate_source: str, config: EvalConfig | None = None, *,
                 cancel: threading.Event | None = None) -> EvalResult:
        """EvaluatorProtocol: the result, from the store when it holds it."""
        return self.evaluate_cached(problem, candidate_source, config, cancel=cancel)[0]

    def evaluate_cached(self, problem: Problem | str | Path, source: str, config: EvalConfig | None = None, *,
                        cancel: threading.Event | None = None) -> tuple[EvalResult, bool]:
        """(EvalResult, reused)."""
        from kernelagent.bench.store import evaluation_key
        from kernelagent.harness import EvalConfig, EvalResult, Status
        from kernelagent.problem import load_problem, sha256_text

        if not hasattr(problem, "sha256"):
            problem = load_problem(problem)
        config = config or EvalConfig()
        settings = config.to_dict()
        fingerprint = self.fingerprint()
        key = evaluation_key(problem.sha256, sha256_text(source), settings, fingerprint)
        hit = self.store.lookup([key])
        if hit is not None:
            with self._count_lock:
                self.reused += 1
            return EvalResult.from_dict(hit[1]), True
        result = self.evaluator.evaluate(problem, source, config, cancel=cancel)
        data = result.to_dict()
        # A harness failure is the machine's fault, not the kernel's: logged, never cached.
        self.store.record_evaluation(key, data, settings=settings, fingerprint=fingerprint,
                                     run_id=self.run_id, cacheable=result.status != Status.HARNESS_ERROR)
        with self._count_lock:
            self.performed += 1
        return result, False


def eval_config(manifest: Manifest, entry: KernelEntry, cpu: bool, trials: int | None = None,
                compile_modes: tuple[str, ...] = ("default",), timeouts: dict[str, float] | None = None):
    """The harness settings verify uses. On the CPU timing means nothing under the
    interpreter, so it is not done at all (correctness only, and faster). The gate compares
    against Inductor's default mode; other `compile_modes` are timed and reported by name. Every
    result is audited by Nsight Compute on a GPU (`audit`): each one can become a lock."""
    from kernelagent.harness import EvalConfig

    return EvalConfig(trials=trials or manifest.trials, backend=entry.backend, audit=True,
                      timing=not cpu, baselines=not cpu, compile_modes=tuple(compile_modes),
                      **({"timeouts": dict(timeouts)} if timeouts else {}))


@dataclass
class KernelCheck:
    """One kernel's verification: the facts every output format (console, JUnit, JSON,
    Markdown, lock) is rendered from."""

    name: str
    problem: str
    kernel: str
    problem_sha256: str
    kernel_sha256: str
    backend: str
    target_speedup: float
    tolerance: float
    verdict: str  # the harness status: correct, incorrect, compile_error, rejected, ...
    correct: bool  # EvalResult.passed: correct and nothing flagged for review or rejection
    speed_checked: bool
    baseline: str | None  # "compile" or "eager": what the speedups below are measured against
    speedup: float | None  # point estimate vs baseline
    speedup_low: float | None  # lower bound of its interval (the point estimate where no interval exists)
    speedups: dict[str, float] = field(default_factory=dict)
    speedup_intervals: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # why it fails; empty: it passes
    notes: list[str] = field(default_factory=list)
    new: bool = False  # no lock entry before this run
    problem_changed: bool = False
    kernel_changed: bool = False
    short_of_target: bool = False  # correct, but its speed fails the target or regressed
    reused: bool = False  # the result came from the store
    seconds: float = 0.0
    environment: dict[str, Any] = field(default_factory=dict)
    result: Any = None  # the EvalResult

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def status(self) -> str:
        return "pass" if self.passed else "fail"

    def message(self) -> str:
        """One line: the failure reasons, else the notes."""
        return "; ".join(self.failures or self.notes) or "passed"

    def lock_entry(self) -> dict[str, Any]:
        return {"problem": self.problem, "kernel": self.kernel, "problem_sha256": self.problem_sha256,
                "kernel_sha256": self.kernel_sha256, "backend": self.backend, "verdict": self.verdict,
                "passed": self.correct, "speed_checked": self.speed_checked, "baseline": self.baseline,
                "speedups": self.speedups if self.speed_checked else {},
                "speedup_intervals": self.speedup_intervals if self.speed_checked else {},
                "environment": self.environment, "date": today()}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "problem": self.problem, "kernel": self.kernel,
                "problem_sha256": self.problem_sha256, "kernel_sha256": self.kernel_sha256,
                "backend": self.backend, "verdict": self.verdict, "correct": self.correct,
                "speed_checked": self.speed_checked, "baseline": self.baseline, "speedup": self.speedup,
                "speedup_low": self.speedup_low, "speedups": self.speedups,
                "speedup_intervals": self.speedup_intervals, "target_speedup": self.target_speedup,
                "tolerance": self.tolerance, "failures": self.failures, "notes": self.notes, "new": self.new,
                "problem_changed": self.problem_changed, "kernel_changed": self.kernel_changed,
                "short_of_target": self.short_of_target, "reused": self.reused,
                "seconds": round(self.seconds, 3)}


def failure_detail(result: EvalResult) -> str:
    """Why a verdict does not pass, in one line: the harness's reason, the first failing
    check (with its first mismatch: index, expected, got) and any rejection or review flag."""
    parts = [result.status]
    if result.reason:
        parts.append(result.reason.strip().splitlines()[0])
    failed = [t for t in result.trials if not t.passed]
    if failed:  # the first failing check, unless the reason already quotes it
        first = failed[0]
        message = " ".join(first.message.split())
        if message not in " ".join((result.reason or "").split()):
            parts.append(f"{first.name} (seed {first.seed}): {message}")
    for flag in result.flags:
        if flag.severity in ("review", "reject"):
            label = "rejected" if flag.severity == "reject" else "flagged for review"
            parts.append(f"{label} [{flag.kind}]: {' '.join(flag.message.split())}")
    return ": ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if len(parts) > 2 else "")


def speed_facts(result: EvalResult) -> tuple[bool, str | None, float | None, float | None, dict, dict]:
    """(measurable, baseline, point, lower bound, speedups, intervals) of a result."""
    timings = result.timings
    measurable = "candidate" in timings and all(t.meaningful for t in timings.values()) and \
        bool((result.fingerprint or {}).get("cuda"))
    speedups = dict(result.speedups) if measurable else {}
    # EvalResult.speedup_intervals (baseline -> [low, high]); a result without one (an old
    # store entry, the server's clock) falls back to the point estimate.
    intervals = {k: list(v) for k, v in (getattr(result, "speedup_intervals", {}) or {}).items()} \
        if measurable else {}
    baseline = "compile" if "compile" in speedups else ("eager" if "eager" in speedups else None)
    if baseline is None:
        return measurable, None, None, None, speedups, intervals
    point = speedups[baseline]
    interval = intervals.get(baseline)
    low = float(interval[0]) if interval else point
    return measurable, baseline, point, low, speedups, intervals


def check_kernel(entry: KernelEntry, result: EvalResult, lock: dict[str, Any] | None, *, environment: dict,
                 reused: bool = False, seconds: float = 0.0, kernel_sha256: str = "",
                 problem_sha256: str = "") -> KernelCheck:
    measurable, baseline, point, low, speedups, intervals = speed_facts(result)
    check = KernelCheck(
        name=entry.name, problem=entry.problem_rel, kernel=entry.kernel_rel,
        problem_sha256=problem_sha256 or result.problem_sha256,
        kernel_sha256=kernel_sha256 or result.candidate_sha256, backend=entry.backend,
        target_speedup=entry.target_speedup, tolerance=entry.tolerance, verdict=result.status,
        correct=bool(result.passed), speed_checked=measurable, baseline=baseline, speedup=point,
        speedup_low=low, speedups=speedups, speedup_intervals=intervals, reused=reused, seconds=seconds,
        environment=environment, result=result, new=lock is None)
    if lock is not None:
        check.kernel_changed = lock.get("kernel_sha256") != check.kernel_sha256
        if lock.get("problem_sha256") != check.problem_sha256:
            check.problem_changed = True
            check.failures.append(
                f"problem changed since the lock ({entry.problem_rel}: sha256 "
                f"{str(lock.get('problem_sha256'))[:12]} -> {check.problem_sha256[:12]}); "
                "regenerate the kernel, or accept it with `kernelagent verify --update-lock`")
    else:
        check.notes.append("new kernel: recorded in the lock")
    if not result.passed:
        check.failures.append(failure_detail(result))
    if not measurable:
        why = "no GPU: correctness checked under the Triton interpreter" if not environment.get("cuda") \
            else "no meaningful timing"
        check.notes.append(f"speed not checked ({why})")
    elif baseline is None:
        check.notes.append("speed not checked (no baseline was timed)")
    elif result.passed:
        name = BASELINE_NAMES[baseline]
        from kernelagent.harness.stats import beats

        # The same rule as optimize's target and bench's fast_p: the interval's low end decides.
        if entry.target_speedup > 0 and not beats(intervals.get(baseline), point, entry.target_speedup):
            check.short_of_target = True
            bound = "lower bound" if intervals.get(baseline) else "speedup (no interval measured)"
            check.failures.append(f"{bound} {low:.3f}x vs {name} is below the target {entry.target_speedup:g}x")
        old = _locked_speedup(lock, baseline, environment)
        if old is not None and point < old * (1.0 - entry.tolerance):
            check.short_of_target = True
            check.failures.append(f"regressed: {point:.3f}x vs {name}, the lock has {old:.3f}x on the same GPU "
                                  f"(tolerance {entry.tolerance:.0%})")
        check.notes.append(f"{point:.3f}x vs {name} (lower bound {low:.3f}x)")
    return check


def _locked_speedup(lock: dict | None, baseline: str, environment: dict) -> float | None:
    """The lock's speedup against the same baseline, measured on the same GPU model."""
    if not lock or not lock.get("speed_checked") or lock.get("baseline") != baseline:
        return None
    if (lock.get("environment") or {}).get("gpu_name") != environment.get("gpu_name"):
        return None
    value = (lock.get("speedups") or {}).get(baseline)
    return float(value) if isinstance(value, (int, float)) else None


@dataclass
class VerifyReport:
    manifest: Path
    lock_path: Path
    checks: list[KernelCheck]
    environment: dict[str, Any]
    evaluated: int
    reused: int
    lock_written: bool
    wall_s: float

    @property
    def speed_checked(self) -> bool:
        return bool(self.environment.get("cuda"))

    @property
    def failed(self) -> list[KernelCheck]:
        return [c for c in self.checks if not c.passed]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": 1, "manifest": str(self.manifest), "lock": str(self.lock_path),
                "exit_code": self.exit_code, "passed": not self.failed, "kernels_total": len(self.checks),
                "kernels_failed": len(self.failed), "speed_checked": self.speed_checked,
                "device": self.environment.get("gpu_name") if self.speed_checked
                else "cpu (Triton interpreter)",
                "evaluated": self.evaluated, "reused": self.reused, "lock_written": self.lock_written,
                "wall_s": round(self.wall_s, 3), "environment": self.environment,
                "kernels": [c.to_dict() for c in self.checks]}


def evaluate_entries(manifest: Manifest, entries: list[KernelEntry], cached: CachedEvaluator,
                     lock: dict[str, dict], trials: int | None = None,
                     on_check: Any = None, compile_modes: tuple[str, ...] = ("default",),
                     timeouts: dict[str, float] | None = None) -> list[KernelCheck]:
    from kernelagent.bench.store import environment as env_of
    from kernelagent.problem import load_problem, read_candidate, sha256_text

    env = env_of(cached.fingerprint())
    # Every file is read first, in the manifest's order: a missing or broken one is bad input
    # (one line, exit 2) before anything is evaluated.
    work = []
    for entry in entries:
        problem = load_problem(entry.problem)
        source = read_candidate(entry.kernel)
        work.append((entry, problem, source))

    def check(item: tuple) -> KernelCheck:
        entry, problem, source = item
        started = time.monotonic()
        result, reused = cached.evaluate_cached(problem, source, eval_config(manifest, entry, cached.cpu, trials,
                                                                             compile_modes, timeouts))
        return check_kernel(entry, result, lock.get(entry.name), environment=env, reused=reused,
                            seconds=time.monotonic() - started, kernel_sha256=sha256_text(source),
                            problem_sha256=problem.sha256)

    # The kernels go to the harness at once, up to as many as its server runs together (their
    # host work overlaps; each timed loop has the device alone). Each is reported as it
    # finishes; the report keeps the manifest's order.
    checks: list[KernelCheck | None] = [None] * len(work)
    with ThreadPoolExecutor(max_workers=max(1, min(cached.jobs, len(work) or 1)),
                            thread_name_prefix="verify") as pool:
        futures = {pool.submit(check, item): i for i, item in enumerate(work)}
        try:
            for future in as_completed(futures):
                checks[futures[future]] = done = future.result()
                if on_check is not None:
                    on_check(done)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [c for c in checks if c is not None]


def updated_lock(lock: dict[str, dict], checks: list[KernelCheck], manifest: Manifest, *,
                 rewrite: bool) -> dict[str, dict]:
    """The lock after this run. Plain verify only adds the new kernels; `rewrite`
    (--update-lock) records every kernel as this run saw it and drops kernels no longer in
    the manifest."""
    names = {k.name for k in manifest.kernels}
    entries = {n: e for n, e in lock.items() if n in names} if rewrite else dict(lock)
    for check in checks:
        if rewrite or check.name not in lock:
            entries[check.name] = merge_entry(lock.get(check.name), check.lock_entry())
    return entries


def preflight(manifest: Manifest, only: list[str] | None = None) -> None:
    """What run_verify would find wrong before evaluating anything, found now: an unknown --only
    name, an unreadable lock, a problem or kernel file that is missing or broken. The command
    calls it before it starts the harness or says anything on stdout."""
    from kernelagent.problem import load_problem, read_candidate

    read_lock(manifest.lock_path)
    for entry in manifest.select(only):
        load_problem(entry.problem)
        read_candidate(entry.kernel)


def run_verify(manifest: Manifest, cached: CachedEvaluator, *, update_lock: bool = False,
               only: list[str] | None = None, trials: int | None = None,
               on_check: Any = None, compile_modes: tuple[str, ...] = ("default",),
               timeouts: dict[str, float] | None = None) -> VerifyReport:
    from kernelagent.bench.store import environment as env_of

    started = time.monotonic()
    lock = read_lock(manifest.lock_path)
    entries = manifest.select(only)
    checks = evaluate_entries(manifest, entries, cached, lock, trials, on_check, compile_modes, timeouts)
    new_lock = updated_lock(lock, checks, manifest, rewrite=update_lock)
    written = write_lock(manifest.lock_path, new_lock)  # False when the text is unchanged
    return VerifyReport(manifest=manifest.path, lock_path=manifest.lock_path, checks=checks,
                        environment=env_of(cached.fingerprint()), evaluated=cached.performed,
                        reused=cached.reused, lock_written=written, wall_s=time.monotonic() - started)

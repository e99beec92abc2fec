"""`kernelagent regenerate`: run the agent on the kernels that fail verification.

For each kernel that `verify` fails (or each named with --only), the agent runs with the
manifest's model and budget, seeded with the current kernel as its first candidate. Its
best kernel then goes through the same verification as `verify` (same settings, through the
store), and replaces the file only when it is better:
- it passes (correct, nothing rejected or flagged for review): never less trusted;
- the current kernel does not pass, or both were timed on a GPU and the new one's speedup is
  at least the current one's. Where speed cannot be measured (no GPU) a passing kernel is
  never replaced: nothing shows the new one is not slower.
A kernel whose only failure is a changed problem, and which passes every other check, is
re-recorded in the lock without calling the model.

Outcomes per kernel: "replaced", "relocked" (the current kernel now passes and the lock is
updated), "short" (correct but short of its target), "failed". Exit code: 1 if any failed,
else 3 if any is short, else 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelagent.ci.lock import merge_entry, read_lock, write_lock
from kernelagent.ci.manifest import KernelEntry, Manifest
from kernelagent.ci.verify import CachedEvaluator, KernelCheck, check_kernel, eval_config, evaluate_entries


@dataclass
class Regeneration:
    name: str
    before: KernelCheck
    outcome: str = "pending"  # replaced | relocked | short | failed | skipped
    detail: str = ""
    after: KernelCheck | None = None
    agent_outcome: str | None = None  # the agent's: success | short_of_target | no_correct_kernel | model_unavailable
    out_dir: str | None = None
    reasons: list[str] = field(default_factory=list)  # why it was regenerated

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "outcome": self.outcome, "detail": self.detail, "reasons": self.reasons,
                "agent_outcome": self.agent_outcome, "out_dir": self.out_dir,
                "before": self.before.to_dict(), "after": self.after.to_dict() if self.after else None}


@dataclass
class RegenerateReport:
    items: list[Regeneration]
    dry_run: bool
    lock_written: bool = False

    @property
    def exit_code(self) -> int:
        outcomes = {i.outcome for i in self.items}
        if "failed" in outcomes:
            return 1
        return 3 if "short" in outcomes else 0

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": 1, "dry_run": self.dry_run, "exit_code": self.exit_code,
                "lock_written": self.lock_written, "kernels": [i.to_dict() for i in self.items]}


def default_out_dir(root: str | Path = "runs") -> Path:
    from kernelagent.orchestrate.records import fresh_out_dir

    return fresh_out_dir(root, prefix="regenerate-")


def _better(new: KernelCheck, old: KernelCheck) -> tuple[bool, str]:
    if not new.correct:
        return False, f"the agent's kernel does not pass verification ({new.message()})"
    if not old.correct:
        return True, "the current kernel does not pass; the new one does"
    if not (new.speed_checked and old.speed_checked and new.speedup is not None and old.speedup is not None):
        return False, "both pass, and speed cannot be compared here (no GPU): the current kernel is kept"
    if new.speedup < old.speedup:
        return False, f"the new kernel is slower ({new.speedup:.3f}x vs {old.speedup:.3f}x): kept the current one"
    return True, f"faster: {new.speedup:.3f}x vs {old.speedup:.3f}x"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.kernelagent-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_regenerate(manifest: Manifest, cached: CachedEvaluator, *, model_factory: Callable[[], Any] | None,
                   out: Path | None, only: list[str] | None = None, dry_run: bool = False,
                   trials: int | None = None, device: str = "auto",
                   say: Callable[[str], None] = print, observer: Callable[..., None] | None = None
                   ) -> RegenerateReport:
    from kernelagent.bench.store import environment as env_of

    lock = read_lock(manifest.lock_path)
    chosen = manifest.select(only)
    checks = evaluate_entries(manifest, chosen, cached, lock, trials)
    todo = [c for c in checks if only or not c.passed]
    items = [Regeneration(name=c.name, before=c, reasons=list(c.failures) or ["named with --only"]) for c in todo]
    report = RegenerateReport(items=items, dry_run=dry_run)
    if dry_run or not items:
        for item in items:
            item.outcome = "skipped"
        return report
    out_root = out or default_out_dir()
    env = env_of(cached.fingerprint())
    entries = {e.name: e for e in manifest.kernels}
    new_lock = dict(lock)
    try:
        for item in items:
            _regenerate_one(item, entries[item.name], manifest, cached, lock, new_lock, env=env,
                            model_factory=model_factory, out_root=out_root, trials=trials, device=device,
                            say=say, observer=observer)
    finally:  # a kernel already regenerated keeps its lock entry, whatever happens to the next
        if new_lock != lock:
            report.lock_written = write_lock(manifest.lock_path, new_lock)
    return report


def _regenerate_one(item: Regeneration, entry: KernelEntry, manifest: Manifest, cached: CachedEvaluator,
                    lock: dict, new_lock: dict, *, env: dict, model_factory: Callable[[], Any] | None,
                    out_root: Path, trials: int | None, device: str, say: Callable[[str], None],
                    observer: Callable[..., None] | None) -> None:
    from kernelagent.orchestrate import optimize
    from kernelagent.agent.budget import Budget
    from kernelagent.problem import load_problem

    before = item.before
    only_lock = before.correct and before.failures and all(
        f.startswith("problem changed since the lock") for f in before.failures)
    if only_lock:
        item.outcome, item.detail = "relocked", "still passes against the changed problem: lock updated"
        item.after = check_kernel(entry, before.result, None, environment=env,
                                  kernel_sha256=before.kernel_sha256, problem_sha256=before.problem_sha256)
        new_lock[item.name] = merge_entry(lock.get(item.name), item.after.lock_entry())
        say(f"{item.name}: {item.detail}")
        return
    current = entry.kernel.read_text(encoding="utf-8")
    run_dir = out_root / item.name
    item.out_dir = str(run_dir)
    say(f"{item.name}: regenerating ({'; '.join(item.reasons)[:200]}) -> {run_dir}")
    budget = Budget(max_turns=manifest.max_turns, max_tokens=manifest.max_tokens,
                    max_cost=manifest.max_cost, timeout=manifest.timeout)
    run = optimize(entry.problem, model_factory(), mode=manifest.mode, budget=budget,
                   target_speedup=entry.target_speedup, out=run_dir, device=device,
                   trials=trials or manifest.trials, evaluator=cached, backend=entry.backend,
                   initial=current, observer=observer,
                   model_info={"api_base": manifest.api_base, "temperature": manifest.temperature},
                   strategy=manifest.strategy, samples=manifest.samples,
                   model_concurrency=manifest.model_concurrency)
    item.agent_outcome = run.result.outcome
    best = run.result.best
    final, replaced = before, False
    if best is not None and best.code and best.code != current:
        problem = load_problem(entry.problem)
        result, _ = cached.evaluate_cached(problem, best.code, eval_config(manifest, entry, cached.cpu, trials))
        candidate = check_kernel(entry, result, None, environment=env, problem_sha256=problem.sha256)
        better, why = _better(candidate, before)
        item.detail = why
        if better:
            _write_atomic(entry.kernel, best.code)
            final, replaced = candidate, True
    elif best is not None:
        item.detail = "the agent found nothing better than the current kernel"
    else:
        item.detail = "the agent found no correct kernel; the file is untouched"
    # Judged as verify will judge it next. Against a changed problem the lock's speeds say
    # nothing; otherwise a regression against the lock still counts (never hidden by a relock).
    reference = None if before.problem_changed else lock.get(item.name)
    after = check_kernel(entry, final.result, reference, environment=env, kernel_sha256=final.kernel_sha256,
                         problem_sha256=final.problem_sha256)
    item.after = after
    if after.passed:
        item.outcome = "replaced" if replaced else "relocked"
        new_lock[item.name] = merge_entry(lock.get(item.name), after.lock_entry())
    else:
        # Short of target: the lock keeps its reference speeds, so verify goes on failing it.
        item.outcome = "short" if after.correct else "failed"
        item.detail = f"{item.detail}; still: {after.message()}" if item.detail else after.message()
    say(f"{item.name}: {item.outcome}: {item.detail}")

"""What a run keeps and reads back: its output folder, its summary.json, and what a resumed
search already spent. No run is started here."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelagent.agent.budget import Budget
from kernelagent.agent.loop import RunResult
from kernelagent.agent.trajectory import Trajectory


@dataclass
class OptimizeRun:
    result: RunResult
    out_dir: Path
    summary: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return self.result.exit_code


def fresh_out_dir(root: str | Path, prefix: str = "", suffix: str = "") -> Path:
    """root/<prefix><timestamp><suffix>, suffixed -2, -3... if it exists: every run's own output
    folder (optimize's, regenerate's)."""
    base = Path(root) / f"{prefix}{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}{suffix}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def default_out_dir(problem_path: str | Path, root: str | Path = "runs") -> Path:
    """A fresh runs/<timestamp>-<problem-stem> folder (suffixed if it exists)."""
    return fresh_out_dir(root, suffix=f"-{Path(problem_path).stem}")


def check_strategy(strategy: str, samples: int) -> None:
    """ValueError for a strategy that does not exist, or samples it cannot use."""
    from kernelagent.search.strategies import STRATEGIES

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)} (got {strategy!r})")
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a whole number >= 1 (got {samples!r})")
    if strategy == "single" and samples != 1:
        raise ValueError("--samples above 1 needs a search strategy: best-of-n, beam or evolve")


def resumable(folder: Path, problem: Any) -> dict[str, Any]:
    """The trajectory of a search run to resume; UserError when it cannot be resumed."""
    from kernelagent.errors import UserError
    from kernelagent.search.tree import load

    try:
        trajectory, _tree = load(folder)
    except ValueError as exc:
        raise UserError(f"--resume {folder}: {exc}") from None
    recorded = (trajectory.get("problem") or {}).get("sha256")
    if recorded and recorded != problem.sha256:
        raise UserError(f"--resume {folder}: {other_problem(problem, (trajectory.get('problem') or {}).get('path'))}")
    return trajectory


def other_problem(problem: Any, recorded_path: Any) -> str:
    """Why a run cannot be resumed for `problem`: it was for another problem (named), or for
    another version of this one."""
    from kernelagent.text import clean_text

    if isinstance(recorded_path, str) and Path(recorded_path).name != problem.path.name:
        return f"the run was for {clean_text(recorded_path)}, not {problem.path.name}; give that problem, or start a new run"
    return f"the run was for another version of {problem.path.name} (its sha256 differs); start a new run"


def restore_spend(budget: Budget, tree: Any, spend: dict[str, Any]) -> None:
    """What a resumed search already spent, counted from its nodes (the wall time from its record):
    every model call that answered, and every one that failed (each took its turn)."""
    called = [n for n in tree.nodes if n.reply is not None or n.verdict == "model_error"]
    budget.turns = len(called)
    budget.prompt_tokens = sum(int(n.cost.get("prompt_tokens", 0)) for n in called)
    budget.completion_tokens = sum(int(n.cost.get("completion_tokens", 0)) for n in called)
    budget.cost = sum(float(n.cost.get("usd", 0.0)) for n in called)
    budget.started = time.monotonic() - float(spend.get("elapsed_s") or 0.0)


def build_summary(result: RunResult, problem: Any, out_dir: Path, budget: Budget,
                  trajectory: Trajectory, config: dict, device_info: dict,
                  wall_s: float) -> dict[str, Any]:
    best = result.best
    measurable = bool(best and best.measurable)
    speedups = best.speedups if best else {}
    costs_known = [s["model"].get("cost_known", False) for s in trajectory.steps if s.get("model")]
    return {
        "format_version": 1,
        "outcome": result.outcome,
        "exit_code": result.exit_code,
        "stop_reason": result.stop_reason,
        "stop_detail": result.stop_detail,
        "problem": {"name": problem.name, "path": str(problem.path), "sha256": problem.sha256},
        "model": config["model"]["name"],
        "mode": config["mode"],
        "device": device_info.get("name"),
        "target_speedup": config["target_speedup"],
        "target_check": result.target_check,
        "best": None if best is None else {
            "kernel": str(out_dir / "kernel.py"),
            "candidate_sha256": hashlib.sha256((best.code or "").encode()).hexdigest(),
            "verdict": best.verdict,
            "speedup_vs_eager": speedups.get("eager") if measurable else None,
            "speedup_vs_inductor": speedups.get("compile") if measurable else None,
            "raw_speedups": speedups,
            # 95% intervals ([low, high]) of each speedup; the target is judged on the low end.
            "speedup_intervals": dict(best.intervals) if measurable else {},
            "timings_meaningful": measurable,
            "timings_ms": {k: v.get("median_ms") for k, v in best.data.get("timings", {}).items()},
        },
        "turns": budget.turns,
        "tokens": {"prompt": budget.prompt_tokens, "completion": budget.completion_tokens,
                   "total": budget.tokens},
        "cost_usd": round(budget.cost, 6),
        "cost_known": bool(costs_known) and all(costs_known),
        "wall_time_s": round(wall_s, 3),
        "tool_time_s": {k: round(v, 3) for k, v in result.tool_seconds.items()},
        "tool_calls": result.tool_calls,
        "out_dir": str(out_dir),
    }

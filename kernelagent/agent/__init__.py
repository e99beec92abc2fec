"""The agent: a model proposes Triton kernels, the harness judges them, the loop iterates.

    from kernelagent.agent import optimize
    from kernelagent.models import LitellmModel
    run = optimize("problem.py", LitellmModel("openai/gpt-4o"), out="runs/x")
    run.exit_code  # 0 success, 3 correct but short of target, 1 no correct kernel

`optimize` wires the pieces (problem, harness, tools, prompts, budget, trajectory) and
writes kernel.py, trajectory.json and summary.json; the loop itself is in loop.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelagent.agent.budget import Budget, LimitsExceeded
from kernelagent.agent.loop import (
    Agent,
    AgentConfig,
    FormatError,
    Observation,
    RunResult,
    Submitted,
    ToolExecutor,
    check_target,
    extract_code,
)
from kernelagent.agent.prompts import Prompts, truncate
from kernelagent.agent.tools import HarnessTools, describe_inputs
from kernelagent.agent.trajectory import Trajectory, write_json_atomic
from kernelagent.errors import EXIT_INTERRUPTED
from kernelagent.models.base import Model

__all__ = ["Agent", "AgentConfig", "Budget", "FormatError", "HarnessTools", "LimitsExceeded",
           "Observation",
           "OptimizeRun", "Prompts", "RunResult", "Submitted", "ToolExecutor", "Trajectory",
           "check_target", "default_out_dir", "describe", "prompt_context", "BACKEND", "extract_code", "optimize", "truncate"]

MODES = ("tools", "text", "auto")
BACKEND = "triton"  # the default; "cuda" for CUDA C++ candidates (load_inline)
BACKENDS = ("triton", "cuda")


@dataclass
class OptimizeRun:
    result: RunResult
    out_dir: Path
    summary: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return self.result.exit_code


def default_out_dir(problem_path: str | Path, root: str | Path = "runs") -> Path:
    """A fresh runs/<timestamp>-<problem-stem> folder (suffixed if it exists)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{stamp}-{Path(problem_path).stem}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def describe(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """Device facts for the prompt, from kernelagent.hardware when it is there."""
    try:
        from kernelagent.hardware import describe_device

        return describe_device(fingerprint)
    except Exception:  # an older or broken hardware table must not stop a run
        cuda = bool(fingerprint.get("cuda"))
        return {"name": fingerprint.get("gpu_name") if cuda else "CPU (Triton interpreter)",
                "kind": "cuda" if cuda else "cpu", "sm_count": fingerprint.get("sm_count"),
                "l2_bytes": fingerprint.get("l2_bytes"), "mem_bytes": None,
                "mem_bandwidth_gbs": None, "peak_tflops": {}}


def prompt_context(problem: Any, *, mode: str, backend: str, inputs: Any, device: dict[str, Any], cpu: bool,
                   target_speedup: float, max_turns: int | None, max_tokens: int | None = None,
                   max_cost: float | None = None, timeout: float | None = None) -> dict[str, Any]:
    """The variables the system and task templates are rendered with. One place, so that
    `optimize`, the RL environment and the prompt datasets show a model the same prompts."""
    return dict(mode=mode, backend=backend, problem_name=problem.display,
                reference_source=problem.source.strip(), inputs=inputs, device=device, cpu=cpu,
                target_speedup=target_speedup, max_turns=max_turns, max_tokens=max_tokens,
                max_cost=max_cost, timeout=timeout)


def optimize(problem_path: str | Path, model: Model, *, mode: str = "auto", max_turns: int = 20,
             max_tokens: int | None = None, max_cost: float | None = None,
             timeout: float | None = None, target_speedup: float = 1.0,
             out: str | Path | None = None, device: str = "auto", trials: int = 5,
             quick_trials: int = 2, eval_overrides: dict[str, Any] | None = None,
             evaluator: Any = None, observer: Callable[..., None] | None = None,
             model_info: dict[str, Any] | None = None,
             budget: Budget | None = None, backend: str = BACKEND,
             initial: str | None = None, strategy: str = "single", samples: int = 1,
             model_concurrency: int | None = None, seed: int = 0,
             resume: str | Path | None = None, reset_clock: bool = True) -> OptimizeRun:
    """Run the agent on one problem. Raises ProblemError / UserError for bad input.

    `budget`, when given, replaces max_turns/max_tokens/max_cost/timeout (a live view can
    hold the same object); `evaluator`, when given, is used and left open. `initial`, the
    source of an existing kernel, is verified first (full trials, timed), shown to the model
    in the task, and counts as the first candidate: the best kernel at the end is never
    worse than it.

    `strategy` other than "single" runs a search (kernelagent/search): `samples` model calls
    per round, `model_concurrency` of them at once, over one shared budget; `resume`, a folder
    such a search wrote, continues it (its strategy, samples and seed; the budget given here
    is the new total, counting what it already spent)."""
    from kernelagent.problem import load_problem

    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
    problem = load_problem(problem_path)
    previous = None
    if resume is not None:
        previous = _resumable(Path(resume), problem)
        out = resume
        strategy, samples = previous["search"]["strategy"], int(previous["search"]["samples"])
        seed = int((previous["search"].get("settings") or {}).get("seed", seed))
    check_strategy(strategy, samples)
    searching = strategy != "single"
    if searching:
        mode = "text"  # a search node is one reply holding one candidate
    out_dir = Path(out) if out else default_out_dir(problem.path)
    out_dir.mkdir(parents=True, exist_ok=True)
    notify = observer or (lambda event, **data: None)
    prompts = Prompts()
    started = time.monotonic()
    with ExitStack() as stack:
        # Inspecting the inputs starts torch in a child process: overlap it with the harness start.
        # Not waited for on the way out: after Ctrl-C the exit must not wait for torch to import.
        pool = ThreadPoolExecutor(max_workers=1)
        stack.callback(pool.shutdown, wait=False, cancel_futures=True)
        inputs = pool.submit(describe_inputs, str(problem.path))
        own_evaluator = evaluator is None
        if own_evaluator:
            from kernelagent.harness import Evaluator

            evaluator = stack.enter_context(Evaluator(device=device))
        fingerprint = evaluator.fingerprint()
        device_info = describe(fingerprint)
        cpu = not fingerprint.get("cuda")
        budget = budget or Budget(max_turns=max_turns, max_tokens=max_tokens,
                                  max_cost=max_cost, timeout=timeout)
        config = {"mode": mode, "backend": backend, "target_speedup": target_speedup,
                  "max_turns": budget.max_turns, "max_tokens": budget.max_tokens,
                  "max_cost": budget.max_cost, "timeout": budget.timeout, "trials": trials, "quick_trials": quick_trials,
                  "device": device, "eval_overrides": eval_overrides or {},
                  "strategy": strategy, "samples": samples, "model_concurrency": model_concurrency,
                  "seed": seed,
                  "model": {"name": getattr(model, "name", type(model).__name__),
                            **(model_info or {})}}
        trajectory = Trajectory(out_dir / "trajectory.json", config=config,
                                environment={**fingerprint, "device_info": device_info},
                                problem={"name": problem.name, "path": str(problem.path),
                                         "sha256": problem.sha256})
        overrides = dict(eval_overrides or {})
        if backend != "triton":
            overrides["backend"] = backend
        tools = HarnessTools(evaluator, problem, prompts, trials=trials, quick_trials=quick_trials,
                             target_speedup=target_speedup, eval_overrides=overrides,
                             inputs=inputs.result())
        context = prompt_context(problem, mode=mode, backend=backend, inputs=tools.inputs, device=device_info,
                                 cpu=cpu, target_speedup=target_speedup, max_turns=budget.max_turns,
                                 max_tokens=budget.max_tokens, max_cost=budget.max_cost, timeout=budget.timeout)
        agent = Agent(model, tools, prompts, budget, trajectory,
                      AgentConfig(mode=mode, target_speedup=target_speedup), observer=notify)
        search = None
        if searching:
            from kernelagent.search import Search, SearchConfig, Tree

            tree = Tree.from_dict(previous["search"]) if previous else None
            if previous:
                trajectory.data["messages"] = list(previous.get("messages") or [])
                trajectory.data["resumed"] = [*previous.get("resumed", []), {"at": dt.datetime.now().isoformat(
                    timespec="seconds"), "nodes": len(tree.nodes)}]
                _restore_spend(budget, tree, previous["search"].get("spend") or {})
            search = Search(model, tools, prompts, budget, trajectory, agent.config,
                            SearchConfig(strategy=strategy, samples=samples, model_concurrency=model_concurrency,
                                         seed=seed),
                            system="", task="", observer=notify, tree=tree)
        notify("start", problem=problem.display, model=config["model"]["name"], mode=mode,
               device=device_info.get("name") or "?", out=str(out_dir))
        if initial is not None:
            # Checked before the wall-clock budget starts: it is not the model's time.
            first = tools.verify(initial)
            tools.last_code = initial  # `code` may be left out to test it again
            agent.seed(first)
            context["initial"] = {"code": initial.strip(), "verdict": first.verdict, "passed": first.passed,
                                  "feedback": truncate(first.text, 4000, 60)}
        if previous is None and reset_clock:
            budget.started = time.monotonic()  # the wall-clock budget covers the loop (a whole model's
            # regions share one clock: reset_clock=False)
        try:
            if search is not None:
                search.system, search.task = prompts.render("system", **context), prompts.render("task", **context)
                if initial is not None and previous is None:
                    search.seed_initial(agent.candidates, first)
                result = search.run()
            else:
                result = agent.run(prompts.render("system", **context), prompts.render("task", **context))
        except KeyboardInterrupt:
            # Ctrl-C: keep what was found. The best correct candidate so far is written as
            # kernel.py (not re-verified: there is no time for that), and summary.json says
            # "interrupted"; then the interrupt goes on to the caller (the CLI exits 130, a
            # bench batch stops).
            best = search.best_obs() if search is not None else agent.best()
            result = RunResult(outcome="interrupted", exit_code=EXIT_INTERRUPTED, stop_reason="interrupted",
                               stop_detail="interrupted (Ctrl-C) before the run ended", best=best,
                               target_check="not re-verified: the run was interrupted",
                               tool_seconds=dict(agent.tool_seconds), tool_calls=dict(agent.tool_calls))
            summary = build_summary(result, problem, out_dir, budget, trajectory, config, device_info,
                                    time.monotonic() - started)
            if search is not None:
                summary["search"] = search.summary()
            summary["best_verified"] = False
            if best is not None and best.code:
                (out_dir / "kernel.py").write_text(best.code, encoding="utf-8")
            write_json_atomic(out_dir / "summary.json", summary)
            trajectory.finish("interrupted", summary)
            if own_evaluator:
                from kernelagent.interrupt import stop_now

                stop_now(evaluator)  # not the graceful close: it waits for the job in flight
            raise
        except BaseException as exc:
            trajectory.finish("error", {"error": f"{type(exc).__name__}: {exc}"})
            raise
    summary = build_summary(result, problem, out_dir, budget, trajectory, config, device_info,
                            time.monotonic() - started)
    if search is not None:
        summary["search"] = search.summary()
    if result.best is not None and result.best.code:
        (out_dir / "kernel.py").write_text(result.best.code, encoding="utf-8")
    write_json_atomic(out_dir / "summary.json", summary)
    trajectory.finish("finished", summary)
    return OptimizeRun(result=result, out_dir=out_dir, summary=summary)


def check_strategy(strategy: str, samples: int) -> None:
    """ValueError for a strategy that does not exist, or samples it cannot use."""
    from kernelagent.search.strategies import STRATEGIES

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)} (got {strategy!r})")
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a whole number >= 1 (got {samples!r})")
    if strategy == "single" and samples != 1:
        raise ValueError("--samples above 1 needs a search strategy: best-of-n, beam or evolve")


def _resumable(folder: Path, problem: Any) -> dict[str, Any]:
    """The trajectory of a search run to resume; UserError when it cannot be resumed."""
    from kernelagent.errors import UserError
    from kernelagent.search.tree import load

    try:
        trajectory, _tree = load(folder)
    except ValueError as exc:
        raise UserError(f"--resume {folder}: {exc}") from None
    recorded = (trajectory.get("problem") or {}).get("sha256")
    if recorded and recorded != problem.sha256:
        raise UserError(f"--resume {folder}: the run was for another version of {problem.path.name} "
                        "(its sha256 differs); start a new run")
    return trajectory


def _restore_spend(budget: Budget, tree: Any, spend: dict[str, Any]) -> None:
    """What a resumed search already spent, counted from its nodes (the wall time from its record)."""
    replied = [n for n in tree.nodes if n.reply is not None]
    budget.turns = len(replied)
    budget.prompt_tokens = sum(int(n.cost.get("prompt_tokens", 0)) for n in replied)
    budget.completion_tokens = sum(int(n.cost.get("completion_tokens", 0)) for n in replied)
    budget.cost = sum(float(n.cost.get("usd", 0.0)) for n in replied)
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


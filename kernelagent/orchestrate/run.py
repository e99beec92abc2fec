"""One run of the agent on one problem: `optimize()` wires the pieces (problem, harness, tools,
prompts, budget, trajectory; the agent loop of kernelagent/agent or a search of
kernelagent/search) and writes kernel.py, trajectory.json and summary.json.

    from kernelagent.orchestrate import optimize
    from kernelagent.models import LitellmModel
    run = optimize("problem.py", LitellmModel("openai/gpt-4o"), out="runs/x")
    run.exit_code  # 0 success, 3 correct but short of target, 1 no correct kernel
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent.agent import BACKEND, BACKENDS, MODES, describe, start_episode
from kernelagent.agent.budget import Budget
from kernelagent.agent.loop import RunResult
from kernelagent.agent.prompts import Prompts, truncate
from kernelagent.agent.tools import describe_inputs
from kernelagent.agent.trajectory import write_json_atomic
from kernelagent.errors import EXIT_INTERRUPTED
from kernelagent.models.base import Model
from kernelagent.orchestrate.records import (OptimizeRun, build_summary, check_strategy, default_out_dir, resumable,
                                             restore_spend)

if TYPE_CHECKING:
    from kernelagent.harness import FingerprintedEvaluator


def optimize(problem_path: str | Path, model: Model, *, mode: str = "auto", max_turns: int = 20,
             max_tokens: int | None = None, max_cost: float | None = None,
             timeout: float | None = None, target_speedup: float = 1.0,
             out: str | Path | None = None, device: str = "auto", trials: int = 5,
             quick_trials: int = 2, eval_overrides: dict[str, Any] | None = None,
             evaluator: FingerprintedEvaluator | None = None, observer: Callable[..., None] | None = None,
             model_info: dict[str, Any] | None = None,
             budget: Budget | None = None, backend: str = BACKEND,
             initial: str | None = None, strategy: str = "single", samples: int = 1,
             model_concurrency: int | None = None, seed: int = 0,
             resume: str | Path | None = None, reset_clock: bool = True,
             shared_budget: bool = False) -> OptimizeRun:
    """Run the agent on one problem. Raises ProblemError / UserError for bad input.

    `budget`, when given, replaces max_turns/max_tokens/max_cost/timeout (a live view can
    hold the same object); `evaluator`, when given, is used and left open. `initial`, the
    source of an existing kernel, is verified first (full trials, timed), shown to the model
    in the task, and counts as the first candidate: the best kernel at the end is never
    worse than it.

    `strategy` other than "single" runs a search (kernelagent/search): `samples` model calls
    per round, `model_concurrency` of them at once, over one shared budget; `resume`, a folder
    such a search wrote, continues it (its strategy, samples and seed; the budget given here
    is the new total, counting what it already spent). `shared_budget`: the budget is one of
    several runs (a whole model's regions), already counting what a resumed search spent, so it
    is not restored from the search's record."""
    from kernelagent.problem import load_problem

    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
    problem = load_problem(problem_path)
    previous = None
    if resume is not None:
        previous = resumable(Path(resume), problem)
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
        episode = start_episode(model=model, evaluator=evaluator, problem=problem, prompts=prompts, budget=budget,
                                mode=mode, trials=trials, quick_trials=quick_trials, target_speedup=target_speedup,
                                eval_overrides=eval_overrides, inputs=inputs.result(),
                                trajectory_path=out_dir / "trajectory.json", record=config,
                                environment={**fingerprint, "device_info": device_info}, backend=backend,
                                observer=notify)
        trajectory, tools, agent = episode.trajectory, episode.tools, episode.agent
        context = episode.context(fingerprint)
        search = None
        if searching:
            from kernelagent.search import Search, SearchConfig, Tree

            tree = Tree.from_dict(previous["search"]) if previous else None
            if previous:
                trajectory.data["messages"] = list(previous.get("messages") or [])
                trajectory.data["resumed"] = [*previous.get("resumed", []), {"at": dt.datetime.now().isoformat(
                    timespec="seconds"), "nodes": len(tree.nodes)}]
                if not shared_budget:
                    restore_spend(budget, tree, previous["search"].get("spend") or {})
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

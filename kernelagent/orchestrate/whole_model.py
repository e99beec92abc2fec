"""A whole model: plan it, optimise its hottest regions in one budget, splice, verify end to end.

1. `plan` (wholemodel/plan.py): regions ranked by device time, each extractable one written as a
   problem.
2. The agent (any `--strategy`) runs on the top regions, hottest first, with ONE budget: the
   turns, tokens, dollars and wall seconds are shared, and a region reached when the budget is
   spent gets no model call (`not attempted`).
3. Each region's verified kernel is spliced alone into a copy of the model and the copy is
   evaluated against the original by the same harness (fresh inputs, derived shapes, timed
   against eager and torch.compile of the whole model). A kernel that makes the model wrong, or
   slower with confidence (the high end of its speedup interval under 1x eager), is left out, and
   the summary says why.
4. The kept kernels are spliced together into `model_optimized.py` (it imports nothing from
   kernelagent) and evaluated end to end once more; that verdict and its speedups are the result.

The end-to-end evaluation uses the rules of wholemodel/e2e.py (PyTorch still runs every region
that was not replaced); `kernelagent eval MODEL OUT/model_optimized.py --whole-model` judges the
file again with the same rules. Each region's kernel was judged with every defence on when it
was verified as a candidate of its own region problem.

Progress: each step is an event for the observer (the CLI's live view): the plan, each region as
it starts and ends (the agent's own turn events in between), each splice check, the verdict.

Nothing computed is lost. OUT/summary.json is written as each region starts and ends, and on
Ctrl-C (outcome `interrupted`, with OUT/report.html); each region's run keeps its own folder
(OUT/regions/region_k). `resume=True` goes on with such a run in OUT: the plan is read back,
finished regions are kept, the interrupted one continues (a search from its tree, the single
loop from its best kernel so far, verified again as its first candidate), the others start,
and the splice and end-to-end checks run again over every kernel found. The run's settings
stand; the budget given is the new total, counting what the run spent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kernelagent.agent.trajectory import write_json_atomic
from kernelagent.errors import UserError
from kernelagent.wholemodel.e2e import e2e_config

if TYPE_CHECKING:
    from kernelagent.agent.budget import Budget
    from kernelagent.models.base import Model
    from kernelagent.harness import FingerprintedEvaluator

SETTINGS = ("top", "min_share", "trials", "strategy", "samples", "mode", "target_speedup", "device")
# Where a region's agent run stands: done ones are kept by a resume, the others run (again).
AGENT_DONE = ("kernel", "none", "broken")


def _speed(result: Any, order: tuple[str, ...] = ("compile", "eager")) -> tuple[float | None, list[float] | None,
                                                                             str | None]:
    for base in order:
        if base in result.speedups and all(t.meaningful for t in result.timings.values()):
            interval = result.speedup_intervals.get(base)
            return float(result.speedups[base]), (list(interval) if interval else None), base
    return None, None, None


def _spent(budget: Budget) -> str | None:
    """What is spent, in words, when the budget allows no further model call; else None."""
    for name, fraction in budget.fractions().items():
        if fraction >= 1.0:
            return budget.describe(name)
    return None


class WholeModelRun:
    def __init__(self, problem: str | Path, model: Model, *, out: str | Path, evaluator: FingerprintedEvaluator,
                 budget: Budget, settings: dict[str, Any], observer: Callable[..., None] | None = None,
                 model_info: dict[str, Any] | None = None) -> None:
        from kernelagent.problem import load_problem

        self.model, self.evaluator, self.budget, self.settings = model, evaluator, budget, settings
        # The model string, API base and temperature a resume reuses (never a key).
        self.model_info = {k: v for k, v in (model_info or {}).items() if k in ("spec", "api_base", "temperature")}
        self.notify = observer or (lambda event, **data: None)
        self.out = Path(out).resolve()  # the summary's paths hold whatever the working folder
        self.original = load_problem(problem)
        self.plan_path = self.out / "plan" / "plan.json"
        self.final_path = self.out / "model_optimized.py"
        self.plan: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []
        self.outcome = "running"
        self.final: dict[str, Any] = {}
        self.spent_before = 0.0  # wall seconds of earlier sessions (a resumed run)
        self.started = time.monotonic()
        self.sessions = 1
        # Why the model stopped answering (a region's run ended `model_unavailable`): no region after
        # it gets a call, and with no kernel found the command exits 5 (EXIT_MODEL_UNAVAILABLE).
        self.model_down: str | None = None

    def e2e_config(self) -> Any:
        """The end-to-end rules (wholemodel/e2e.py). On the CPU nothing is timed: the interpreter's
        times mean nothing, and a speed check there would decide nothing."""
        cpu = self.settings["device"] == "cpu"
        return e2e_config(self.settings["trials"], **({"timing": False, "baselines": False} if cpu else {}))

    @property
    def by_id(self) -> dict[str, dict[str, Any]]:
        return {r["region"]: r for r in self.rows}

    # -- the steps -------------------------------------------------------------------------
    def make_plan(self, plan_data: dict | None) -> None:
        from kernelagent.wholemodel.plan import make_plan

        if plan_data is not None:
            self.plan = plan_data
            self.plan_path.parent.mkdir(parents=True, exist_ok=True)
            self.plan_path.write_text(json.dumps(plan_data, indent=1) + "\n", encoding="utf-8")
        elif self.plan is None:
            self.notify("plan_start", problem=self.original.display, device=self.settings["device"])
            self.plan = make_plan(self.original.path, self.out / "plan", device=self.settings["device"])
        chosen = self.chosen()
        if not self.rows:
            for region in self.plan["regions"]:
                why = "" if region in chosen else (region["why_not"] if not region["extractable"] else
                                                   "below the share threshold or past --regions")
                self.rows.append({"region": region["id"], "kind": region["kind"],
                                  "ops": ", ".join(dict.fromkeys(region["ops"])), "share": region["share"],
                                  "amdahl_bound": region["amdahl_bound"], "problem": region.get("problem"),
                                  "status": "not attempted", "why": why, "agent": None, "chosen": region in chosen})
        self.notify("plan", regions=len(self.plan["regions"]),
                    chosen=[(r["id"], r["share"], r["kind"]) for r in chosen], totals=self.plan["totals"])

    def chosen(self) -> list[dict[str, Any]]:
        assert self.plan is not None
        return [r for r in self.plan["regions"] if r["extractable"] and r["share"] >= self.settings["min_share"]
                ][: self.settings["top"]]

    def optimise_regions(self) -> None:
        chosen = self.chosen()
        for index, region in enumerate(chosen, 1):
            row = self.by_id[region["id"]]
            if row["agent"] in AGENT_DONE:
                continue
            self.optimise_region(region, row, index, len(chosen))

    def optimise_region(self, region: dict, row: dict, index: int, count: int) -> None:
        from kernelagent.orchestrate.run import optimize
        from kernelagent.problem import ProblemError

        folder = self.out / "regions" / region["id"]
        resume, initial = self._continue_from(folder, row)
        spent = _spent(self.budget)
        if self.model_down is not None:
            spent = f"the model did not answer in an earlier region: {self.model_down}"
        if spent is not None and initial is None:
            row.update(status="not attempted", agent="skipped", why=f"the shared budget was spent before it ({spent})")
            self.notify("region_done", region=region["id"], status=row["status"], why=row["why"])
            return
        self.notify("region", region=region["id"], index=index, count=count, share=region["share"],
                    kind=region["kind"], resumed=row["agent"] == "interrupted")
        if resume is None and initial is None:  # a fresh run here: nothing of an earlier one may pass for its own
            for name in ("kernel.py", "summary.json", "trajectory.json"):
                (folder / name).unlink(missing_ok=True)
        row.update(status="running", agent="interrupted", run=str(folder.relative_to(self.out)), why="")
        turns_before = self.budget.turns
        self.save()
        s = self.settings
        try:
            run = optimize(region["problem"], self.model, mode=s["mode"], budget=self.budget, out=folder,
                           evaluator=self.evaluator, trials=s["trials"], target_speedup=s["target_speedup"],
                           strategy=s["strategy"], samples=s["samples"], observer=self.notify, reset_clock=False,
                           resume=resume, initial=initial, shared_budget=True)
        except ProblemError as exc:  # the region's problem is broken or too large here: the others go on
            row.update(status="left out", agent="broken", why=f"its problem could not be judged: {exc}")
            self.notify("region_done", region=region["id"], status=row["status"], why=row["why"])
            return
        finally:
            row["turns"] = int(row.get("turns") or 0) + self.budget.turns - turns_before
        best = run.result.best
        if run.result.outcome == "model_unavailable":
            self.model_down = run.result.stop_detail
            row.update(status="model unavailable", agent="skipped",  # a resume asks the model again
                       why=f"the model did not answer: {run.result.stop_detail}")
        elif best is None or not best.passed or not best.code:
            if row["turns"] == 0:
                row.update(status="not attempted", agent="skipped",
                           why=f"no model call was made ({run.result.stop_reason}: {run.result.stop_detail})")
            else:
                row.update(status="no kernel", agent="none",
                           why=f"the agent found no verified kernel ({run.result.stop_reason}: "
                               f"{run.result.stop_detail})")
        else:
            speed = run.summary.get("best") or {}
            row.update(status="kernel found", agent="kernel", why="", kernel=str(folder / "kernel.py"),
                       kernel_outcome=run.result.outcome,
                       kernel_speedup=speed.get("speedup_vs_inductor") or speed.get("speedup_vs_eager"),
                       kernel_interval=(speed.get("speedup_intervals") or {}).get("compile"))
        self.notify("region_done", region=region["id"], status=row["status"], why=row["why"],
                    speedup=row.get("kernel_speedup"))
        self.save()

    def _continue_from(self, folder: Path, row: dict) -> tuple[Path | None, str | None]:
        """How an interrupted region goes on: (a search folder to resume, or the best kernel so far)."""
        if row.get("agent") != "interrupted":
            return None, None
        try:
            trajectory = json.loads((folder / "trajectory.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            trajectory = {}
        if isinstance(trajectory, dict) and isinstance(trajectory.get("search"), dict) \
                and self.settings["strategy"] != "single":
            return folder, None
        kernel = folder / "kernel.py"
        return None, (kernel.read_text(encoding="utf-8") if kernel.is_file() else None)

    def splice_checks(self) -> dict[str, Path]:
        """Each kernel alone in the model, judged end to end against the original. The spliced files
        (each kernel alone, and all of them together for verify()) come from one capture."""
        from kernelagent.wholemodel.plan import splice_many

        config = self.e2e_config()
        found = {row["region"]: Path(row["kernel"]) for row in self.rows if row.get("agent") == "kernel"}
        jobs = [({rid: path}, self.out / "splices" / f"{rid}.py") for rid, path in found.items()]
        if len(found) > 1:
            jobs.append((dict(found), self.final_path))
        import shutil

        self.final_path.unlink(missing_ok=True)
        shutil.rmtree(self.out / "splices", ignore_errors=True)  # written again below, for this run's kernels
        failed = splice_many(self.original.path, self.plan_path, jobs, device=self.settings["device"]) if jobs else {}
        kept: dict[str, Path] = {}
        for rid, path in found.items():
            row = self.by_id[rid]
            alone = self.out / "splices" / f"{rid}.py"
            if str(alone) in failed:
                row.update(status="left out", why=f"it could not be spliced: {failed[str(alone)]}")
                self.notify("splice", region=rid, status=row["status"], why=row["why"])
                continue
            result = self.evaluator.evaluate(self.original.path, alone.read_text(encoding="utf-8"), config)
            # "Slower" means slower than the model as written (eager): torch.compile of the whole model
            # is reported beside it, but a model that was already slower than Inductor stays so.
            point, interval, base = _speed(result, ("eager",))
            row.update(e2e_alone=result.status, e2e_alone_speedup=point, e2e_alone_interval=interval,
                       e2e_baseline=base, e2e_alone_vs_compile=_speed(result, ("compile",))[0])
            if not result.passed:
                reason = (result.reason or "").splitlines()[0][:200] if result.reason else ""
                row.update(status="left out", why=f"spliced alone, the model is {result.status}: {reason}")
            elif interval is not None and interval[1] < 1.0:
                row.update(status="left out", why=f"spliced alone, the model is slower: {point:.3f}x "
                                                  f"[{interval[0]:.3f}, {interval[1]:.3f}] vs {base}")
            else:
                row.update(status="spliced", why="")
                kept[rid] = path
            self.notify("splice", region=rid, status=row["status"], why=row["why"], speedup=point)
        if len(found) == 1 and kept:  # one kernel: the model with it alone is the final one
            self.final_path.write_text((self.out / "splices" / f"{next(iter(kept))}.py").read_text(encoding="utf-8"),
                                       encoding="utf-8")
        elif kept != found:  # some were left out: the file of all of them together is not the one
            self.final_path.unlink(missing_ok=True)
        return kept

    def verify(self, kept: dict[str, Path]) -> None:
        from kernelagent.wholemodel.plan import splice

        config = self.e2e_config()
        device = self.settings["device"]
        if not self.final_path.is_file():
            splice(self.original.path, self.plan_path, kept, self.final_path, device=device)
        final = self.evaluator.evaluate(self.original.path, self.final_path.read_text(encoding="utf-8"), config)
        while not final.passed and kept:  # together they break what each passed alone: drop the coldest
            coldest = list(kept)[-1]
            kept.pop(coldest)
            self.by_id[coldest].update(status="left out", why="with the other kernels spliced, the model failed: "
                                                              f"{final.status}")
            splice(self.original.path, self.plan_path, kept, self.final_path, device=device)
            final = self.evaluator.evaluate(self.original.path, self.final_path.read_text(encoding="utf-8"), config)
        point, interval, base = _speed(final)
        for row in self.rows:  # contribution: the share of the original's time the kernel removed
            if row["status"] == "spliced" and row.get("kernel_speedup"):
                row["contribution"] = round(row["share"] * (1 - 1 / float(row["kernel_speedup"])), 4)
        self.final = {"spliced": list(kept), "verdict": final.status, "passed": bool(final.passed),
                      "reason": final.reason, "e2e_speedups": dict(final.speedups),
                      "e2e_intervals": {k: list(v) for k, v in final.speedup_intervals.items()},
                      "e2e_speedup": point, "e2e_interval": interval, "e2e_baseline": base,
                      "e2e_vs_eager": _speed(final, ("eager",))[0], "e2e_vs_compile": _speed(final, ("compile",))[0],
                      "timings_meaningful": point is not None}
        self.notify("e2e", verdict=final.status, spliced=list(kept), speedup=point, interval=interval, baseline=base)

    # -- the record ------------------------------------------------------------------------
    def interrupted(self) -> None:
        """Ctrl-C: the region in flight says what it kept; the regions not reached say why."""
        self.outcome = "interrupted"
        for row in self.rows:
            if row["status"] == "running":
                kernel = self.out / row.get("run", "") / "kernel.py"
                row.update(status="interrupted", why="interrupted during its run; " + (
                    f"its best kernel so far is kept (not re-verified): {kernel}" if kernel.is_file()
                    else "no correct kernel yet"))
            elif row.get("chosen") and row.get("agent") is None:
                row.update(why="the run was interrupted before this region")
            elif row.get("agent") == "kernel" and row["status"] not in ("spliced", "left out"):
                row.update(why="the run was interrupted before the end-to-end checks")
        self.save()

    def summary(self) -> dict[str, Any]:
        spliced, passed = self.final.get("spliced", []), bool(self.final.get("passed"))
        # The command's exit code, as optimize's summary.json has it: 0 the spliced model passes
        # end to end with a region replaced, 1 none could be, 130 interrupted; None while running.
        # 5: the model did not answer and no region has a kernel of its (EXIT_MODEL_UNAVAILABLE).
        unanswered = self.model_down is not None and not any(r.get("agent") == "kernel" for r in self.rows)
        exit_code = {"interrupted": 130, "finished": 0 if passed and spliced else (5 if unanswered else 1)
                     }.get(self.outcome)
        return {"format_version": 2, "kind": "whole_model", "outcome": self.outcome, "exit_code": exit_code,
                "model_unavailable": self.model_down,
                "problem": str(self.original.path), "problem_sha256": self.original.sha256,
                "model": getattr(self.model, "name", type(self.model).__name__), "model_info": self.model_info,
                "settings": self.settings,
                "device": self.settings["device"], "plan": str(self.plan_path),
                "model_optimized": str(self.final_path) if self.final else None, "regions": self.rows,
                "spliced": self.final.get("spliced", []), "verdict": self.final.get("verdict"),
                "passed": bool(self.final.get("passed")), "reason": self.final.get("reason"),
                **{k: v for k, v in self.final.items() if k.startswith("e2e") or k == "timings_meaningful"},
                "budget": self.budget.snapshot(), "sessions": self.sessions,
                "wall_time_s": round(self.spent_before + time.monotonic() - self.started, 3),
                "plan_totals": (self.plan or {}).get("totals")}

    def save(self) -> dict[str, Any]:
        from kernelagent.orchestrate.whole_report import render_html

        summary = self.summary()
        write_json_atomic(self.out / "summary.json", summary)
        (self.out / "report.html").write_text(render_html(summary, self.out), encoding="utf-8")
        return summary

    def restore(self, previous: dict[str, Any]) -> None:
        """A resumed run: the plan, the rows and the spend of `previous` (its summary.json)."""
        try:
            self.plan = json.loads(self.plan_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.plan = None  # interrupted while planning: planned again
        if self.plan is not None:
            self.rows = [dict(r) for r in previous.get("regions") or []]
        for row in self.rows:
            if row.get("agent") == "kernel":
                row.update(status="kernel found", why="")  # its splice checks run again
            elif row.get("agent") == "skipped":
                row.update(agent=None)  # not attempted for want of budget: it may get some now
            for key in ("e2e_alone", "e2e_alone_speedup", "e2e_alone_interval", "e2e_baseline",
                        "e2e_alone_vs_compile", "contribution"):
                row.pop(key, None)
        spend = previous.get("budget") or {}
        self.budget.turns = int(spend.get("turns") or 0)
        self.budget.prompt_tokens = int(spend.get("prompt_tokens") or 0)
        self.budget.completion_tokens = int(spend.get("completion_tokens") or 0)
        self.budget.cost = float(spend.get("cost_usd") or 0.0)
        self.budget.started = time.monotonic() - float(spend.get("elapsed_s") or 0.0)
        self.spent_before = float(previous.get("wall_time_s") or 0.0)
        self.sessions = int(previous.get("sessions") or 1) + 1


def read_previous(out: str | Path, problem: Any) -> dict[str, Any]:
    """The summary.json of a whole-model run in `out`, to resume; UserError when there is none."""
    where = Path(out) / "summary.json"
    try:
        previous = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--resume {out}: no whole-model run there (no summary.json)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"--resume {out}: cannot read {where}: {exc}") from None
    if not isinstance(previous, dict) or previous.get("kind") != "whole_model":
        raise UserError(f"--resume {out}: {where} is not a whole-model run's summary (resume a single problem's "
                        "search without --whole-model)")
    if "settings" not in previous:
        raise UserError(f"--resume {out}: the run was written by a kernelagent that could not resume it; start a "
                        "new run")
    if previous.get("problem_sha256") not in (None, problem.sha256):
        from kernelagent.orchestrate.records import other_problem

        raise UserError(f"--resume {out}: {other_problem(problem, previous.get('problem'))}")
    return previous


def optimize_whole_model(problem: str | Path, model: Model, *, out: str | Path, evaluator: FingerprintedEvaluator,
                         budget: Budget, device: str = "cpu", top: int = 3, min_share: float = 0.01, trials: int = 5,
                         strategy: str = "single", samples: int = 1, mode: str = "auto",
                         target_speedup: float = 1.0, observer: Callable[..., None] | None = None,
                         plan_data: dict | None = None, resume: bool = False,
                         model_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Returns the summary (also written to OUT/summary.json); the model is OUT/model_optimized.py.
    KeyboardInterrupt: the summary and report say what was kept (module doc), then it goes on up."""
    from kernelagent.problem import load_problem

    settings = dict(top=top, min_share=min_share, trials=trials, strategy=strategy, samples=samples, mode=mode,
                    target_speedup=target_speedup, device=device)
    previous = read_previous(out, load_problem(problem)) if resume else None
    if previous is not None:
        settings = {**settings, **{k: v for k, v in previous["settings"].items() if k in SETTINGS}}
    run = WholeModelRun(problem, model, out=out, evaluator=evaluator, budget=budget, settings=settings,
                        observer=observer, model_info=model_info)
    run.out.mkdir(parents=True, exist_ok=True)
    if previous is not None:
        run.restore(previous)
    try:
        run.make_plan(plan_data)
        if previous is None:
            budget.started = time.monotonic()  # one clock for every region's loop (the plan is not theirs)
        run.save()
        run.optimise_regions()
        kept = run.splice_checks()
        run.verify(kept)
    except KeyboardInterrupt:
        run.interrupted()
        raise
    run.outcome = "finished"
    return run.save()

"""A whole model: plan it, optimise its hottest regions in one budget, splice, verify end to end.

1. `plan` (plan.py): regions ranked by device time, each extractable one written as a problem.
2. The agent (any `--strategy`) runs on the top regions, hottest first, with ONE budget: the
   turns, tokens, dollars and wall seconds are shared, and a region started when the budget is
   spent gets no model call.
3. Each region's verified kernel is spliced alone into a copy of the model and the copy is
   evaluated against the original by the same harness (fresh inputs, derived shapes, timed
   against eager and torch.compile of the whole model). A kernel that makes the model wrong, or
   slower with confidence (the high end of its speedup interval under 1x eager), is left out, and
   the summary says why.
4. The kept kernels are spliced together into `model_optimized.py` (it imports nothing from
   kernelagent) and evaluated end to end once more; that verdict and its speedups are the result.

The end-to-end evaluation is the harness's, with the two rules that judge who did the work
relaxed (the static pass reports, the heavy-op and device-share rules are off): PyTorch still
runs every region that was not replaced. Each region's kernel was judged with every defence on
when it was verified as a candidate of its own region problem.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from kernelagent.agent.trajectory import write_json_atomic
from kernelagent.text import html_text

E2E_OVERRIDES = {"static_check": "warn", "torch_work": "allow", "kernel_evidence": False}


def e2e_config(trials: int) -> Any:
    from kernelagent.harness import EvalConfig

    return EvalConfig(trials=trials, **E2E_OVERRIDES)


def _speed(result: Any, order: tuple[str, ...] = ("compile", "eager")) -> tuple[float | None, list[float] | None,
                                                                             str | None]:
    for base in order:
        if base in result.speedups and all(t.meaningful for t in result.timings.values()):
            interval = result.speedup_intervals.get(base)
            return float(result.speedups[base]), (list(interval) if interval else None), base
    return None, None, None


def optimize_whole_model(problem: str | Path, model: Any, *, out: str | Path, evaluator: Any, budget: Any,
                         device: str = "cpu", top: int = 3, min_share: float = 0.01, trials: int = 5,
                         strategy: str = "single", samples: int = 1, mode: str = "auto",
                         target_speedup: float = 1.0, observer: Callable[..., None] | None = None,
                         plan_data: dict | None = None) -> dict[str, Any]:
    """Returns the summary (also written to OUT/summary.json); the model is OUT/model_optimized.py."""
    from kernelagent.agent import optimize
    from kernelagent.problem import ProblemError, load_problem
    from kernelagent.wholemodel.plan import PlanError, make_plan, splice

    notify = observer or (lambda event, **data: None)
    started = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    original = load_problem(problem)
    plan = plan_data or make_plan(original.path, out / "plan", device=device)
    plan_path = out / "plan" / "plan.json"
    if plan_data is not None:
        plan_path.parent.mkdir(parents=True, exist_ok=True)
        plan_path.write_text(json.dumps(plan_data, indent=1) + "\n", encoding="utf-8")
    rows: list[dict[str, Any]] = []
    chosen = [r for r in plan["regions"] if r["extractable"] and r["share"] >= min_share][:top]
    for region in plan["regions"]:
        rows.append({"region": region["id"], "kind": region["kind"], "share": region["share"],
                     "amdahl_bound": region["amdahl_bound"], "status": "not attempted",
                     "why": region["why_not"] if not region["extractable"] else
                     ("below the share threshold or past --regions" if region not in chosen else "")})
    by_id = {r["region"]: r for r in rows}
    budget.started = time.monotonic()  # one clock for every region's loop
    kernels: dict[str, Path] = {}
    for region in chosen:
        row = by_id[region["id"]]
        notify("region", region=region["id"], share=region["share"], kind=region["kind"])
        try:
            run = optimize(region["problem"], model, mode=mode, budget=budget, out=out / "regions" / region["id"],
                           evaluator=evaluator, trials=trials, target_speedup=target_speedup, strategy=strategy,
                           samples=samples, observer=observer, reset_clock=False)
        except ProblemError as exc:  # the region's problem is broken or too large here: the others go on
            row.update(status="left out", why=f"its problem could not be judged: {exc}")
            continue
        best = run.result.best
        row.update(status="no kernel", why=run.summary.get("stop_detail") or run.result.outcome,
                   kernel_outcome=run.result.outcome)
        if best is None or not best.passed or not best.code:
            row["why"] = f"the agent found no verified kernel ({run.result.stop_reason}: {run.result.stop_detail})"
            continue
        speed = (run.summary.get("best") or {})
        row.update(kernel_speedup=speed.get("speedup_vs_inductor") or speed.get("speedup_vs_eager"),
                   kernel_interval=(speed.get("speedup_intervals") or {}).get("compile"))
        kernels[region["id"]] = out / "regions" / region["id"] / "kernel.py"
    # Each kernel alone in the model, judged end to end against the original.
    config = e2e_config(trials)
    kept: dict[str, Path] = {}
    for rid, path in kernels.items():
        row = by_id[rid]
        try:
            alone = splice(original.path, plan_path, {rid: path}, out / "splices" / f"{rid}.py", device=device)
        except PlanError as exc:
            row.update(status="left out", why=f"it could not be spliced: {exc}")
            continue
        result = evaluator.evaluate(original.path, alone.read_text(encoding="utf-8"), config)
        # "Slower" means slower than the model as written (eager): torch.compile of the whole model
        # is reported beside it, but a model that was already slower than Inductor stays so.
        point, interval, base = _speed(result, ("eager",))
        row.update(e2e_alone=result.status, e2e_alone_speedup=point, e2e_alone_interval=interval, e2e_baseline=base,
                   e2e_alone_vs_compile=_speed(result, ("compile",))[0])
        if not result.passed:
            row.update(status="left out", why=f"spliced alone, the model is {result.status}: "
                                              f"{(result.reason or '').splitlines()[0][:200] if result.reason else ''}")
        elif interval is not None and interval[1] < 1.0:
            row.update(status="left out", why=f"spliced alone, the model is slower: {point:.3f}x "
                                              f"[{interval[0]:.3f}, {interval[1]:.3f}] vs {base}")
        else:
            row.update(status="spliced", why="")
            kept[rid] = path
    final_path = out / "model_optimized.py"
    splice(original.path, plan_path, kept, final_path, device=device)
    final = evaluator.evaluate(original.path, final_path.read_text(encoding="utf-8"), config)
    while not final.passed and kept:  # together they break what each passed alone: drop the coldest
        coldest = list(kept)[-1]
        kept.pop(coldest)
        by_id[coldest].update(status="left out", why="with the other kernels spliced, the model failed: "
                                                     f"{final.status}")
        splice(original.path, plan_path, kept, final_path, device=device)
        final = evaluator.evaluate(original.path, final_path.read_text(encoding="utf-8"), config)
    point, interval, base = _speed(final)
    for row in rows:  # contribution: the share of the original's time the kernel removed
        if row["status"] == "spliced" and row.get("kernel_speedup"):
            row["contribution"] = round(row["share"] * (1 - 1 / float(row["kernel_speedup"])), 4)
    summary = {"format_version": 1, "kind": "whole_model", "problem": str(original.path),
               "device": device, "plan": str(plan_path), "model_optimized": str(final_path),
               "regions": rows, "spliced": list(kept), "verdict": final.status, "passed": bool(final.passed),
               "reason": final.reason, "e2e_speedups": dict(final.speedups),
               "e2e_intervals": {k: list(v) for k, v in final.speedup_intervals.items()},
               "e2e_speedup": point, "e2e_interval": interval, "e2e_baseline": base,
               "e2e_vs_eager": _speed(final, ("eager",))[0], "e2e_vs_compile": _speed(final, ("compile",))[0],
               "timings_meaningful": point is not None,
               "budget": budget.snapshot(), "wall_time_s": round(time.monotonic() - started, 3),
               "plan_totals": plan["totals"]}
    write_json_atomic(out / "summary.json", summary)
    (out / "report.html").write_text(render_html(summary), encoding="utf-8")
    return summary


def render_html(summary: dict[str, Any]) -> str:
    """report.html. A region's `why` and the verdict quote what the harness said of the spliced
    model (a candidate's reason): every string goes through kernelagent.text.html_text."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"<td>{v:.4g}</td>"
        return f"<td>{html_text(str(v if v is not None else '–'))}</td>"

    head = ("region", "kind", "share", "Amdahl bound", "status", "kernel speedup", "alone end to end",
            "contribution", "why")
    body = "".join("<tr>" + "".join(cell(x) for x in (
        r["region"], r["kind"], r["share"], r.get("amdahl_bound"), r["status"], r.get("kernel_speedup"),
        r.get("e2e_alone_speedup"), r.get("contribution"), r.get("why"))) + "</tr>" for r in summary["regions"])
    e2e = summary.get("e2e_speedup")
    interval = summary.get("e2e_interval")
    line = (f"{e2e:.3f}x [{interval[0]:.3f}, {interval[1]:.3f}] vs {summary.get('e2e_baseline')}"
            if e2e is not None and interval else "not measurable here (no GPU)" if e2e is None else f"{e2e:.3f}x")
    return (f"<!doctype html><meta charset='utf-8'><title>kernelagent whole model</title>"
            f"<h1>{html_text(Path(summary['problem']).name)}: whole model</h1>"
            f"<p id='e2e'>end to end: {html_text(summary['verdict'])}, {html_text(line)}; spliced: "
            f"{html_text(', '.join(summary['spliced']) or 'none')}</p>"
            f"<table id='regions'><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>")

"""`kernelagent optimize MODEL --whole-model`: the CLI side of orchestrate/whole_model.py.

Progress goes to stderr as the run goes (a live panel on a terminal, one line per event with
--no-live or in a pipe): the plan, each region as it starts and ends, each turn, the splice
checks and the verdict. Exit codes: 0 the spliced model passes end to end with at least one
region replaced, 1 no region could be replaced (the model is unchanged), 2 bad input, 5 the
model did not answer (timeout and retries spent) and no region has a kernel of its, 130
interrupted (one line: what was kept, and the command that goes on).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kernelagent.errors import EXIT_MODEL_UNAVAILABLE, EXIT_USAGE, UserError
from kernelagent.text import plural, terminal_text

if TYPE_CHECKING:
    from kernelagent.agent.budget import Budget


def run_whole_model(*, problem: Path, llm: Any, budget: Budget, out: Path, device: str, trials: int, strategy: str,
                    samples: int, mode: str, target_speedup: float, regions: int, live: bool | None, quiet: bool,
                    resume: bool, model_info: dict[str, Any] | None = None) -> int:
    from kernelagent.agent.live import LiveView
    from kernelagent.cli.core import interrupted
    from kernelagent.devices import gpu_indices
    from kernelagent.harness import Evaluator, HarnessStartError
    from kernelagent.interrupt import stop_now
    from kernelagent.orchestrate.whole_model import optimize_whole_model

    plan_device = device if device != "auto" else ("cuda" if gpu_indices() else "cpu")
    view = LiveView(budget, live=live, quiet=quiet)
    evaluator = None
    try:
        with view:
            try:
                evaluator = Evaluator(device=device)
                summary = optimize_whole_model(problem, llm, out=out, evaluator=evaluator, budget=budget,
                                               device="cpu" if plan_device == "cpu" else plan_device, top=regions,
                                               trials=trials, strategy=strategy, samples=samples, mode=mode,
                                               target_speedup=target_speedup, observer=view, resume=resume,
                                               model_info=model_info)
            except KeyboardInterrupt:
                if evaluator is not None:
                    stop_now(evaluator)  # not the graceful close: it would wait for the job in flight
                    evaluator = None
                raise
            finally:
                if evaluator is not None:
                    evaluator.close()
    except KeyboardInterrupt:
        raise interrupted(_interrupted_line(problem, out)) from None
    except UserError as exc:
        typer.echo(terminal_text(f"error: {exc}"), err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except HarnessStartError as exc:
        typer.echo(terminal_text(f"error: the evaluation harness could not start: {str(exc).splitlines()[0]}"),
                   err=True)
        raise typer.Exit(EXIT_USAGE) from None
    if summary["exit_code"] == EXIT_MODEL_UNAVAILABLE:
        typer.echo(terminal_text(f"whole model: the model did not answer, no kernel was judged "
                                 f"({summary.get('model_unavailable')}); the model is unchanged; "
                                 f"summary: {out / 'summary.json'}"))
        return summary["exit_code"]
    speed = summary.get("e2e_speedup")
    interval = summary.get("e2e_interval")
    measured = (f"{speed:.3f}x [{interval[0]:.3f}, {interval[1]:.3f}] vs {summary.get('e2e_baseline')}"
                if speed is not None and interval else "timings not meaningful on the CPU")
    typer.echo(terminal_text(f"whole model: {summary['verdict']}; regions spliced: "
                             f"{', '.join(summary['spliced']) or 'none'}; end to end {measured}; "
                             f"model: {out / 'model_optimized.py' if summary['model_optimized'] else 'none'}; "
                             f"report: {out / 'report.html'}; "
                             f"summary: {out / 'summary.json'}"))
    return summary["exit_code"]


def _interrupted_line(problem: Path, out: Path) -> str:
    """What an interrupted whole-model run kept, from its summary.json (written on the way out)."""
    import json

    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        rows = [r for r in summary.get("regions") or [] if r.get("chosen")]
    except (OSError, ValueError, AttributeError):
        return f"interrupted before anything was kept in {out}"
    done = [r for r in rows if r.get("agent") in ("kernel", "none", "broken")]
    kernels = [r["region"] for r in rows if r.get("agent") == "kernel" or (r.get("status") == "interrupted"
                                                                            and "is kept" in (r.get("why") or ""))]
    return (f"interrupted: {len(done)} of {plural(len(rows), 'region')} finished; kernels kept: {', '.join(kernels) or 'none'}; "
            f"report: {out / 'report.html'}; summary: {out / 'summary.json'}; to go on: kernelagent optimize "
            f"{problem} --whole-model --resume {out}")

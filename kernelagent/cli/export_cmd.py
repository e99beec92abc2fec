"""`kernelagent export sft RUN... --min-speedup X --out sft.jsonl`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kernelagent.cli.core import Command, finite, typer_app

export_app = typer_app(help="Export training data from agent runs.", no_args_is_help=True)


@export_app.command("sft", cls=Command)
def sft(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN...", help="Run folders of `kernelagent optimize` (or folders holding them).")],
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="JSONL file of chat rows; statistics go to <stem>.stats.json beside it.")] = Path("sft.jsonl"),
    min_speedup: Annotated[float, typer.Option("--min-speedup", metavar="X", callback=finite(0), help="Keep kernels at least this fast vs TorchInductor (else eager). Runs without meaningful timings (CPU) pass only at 0 or with --include-unmeasured.")] = 1.0,
    per_problem: Annotated[int, typer.Option("--per-problem", min=1, metavar="N", help="Rows kept per problem (the most concise reasoning first).")] = 1,
    include_unmeasured: Annotated[bool, typer.Option("--include-unmeasured", help="Keep verified kernels whose timings mean nothing (CPU runs).")] = False,
) -> None:
    """Turn verified agent runs into chat-format fine-tuning rows."""
    from kernelagent.cli import run_guarded

    run_guarded(_sft, runs, out, min_speedup, per_problem, include_unmeasured)


def _sft(runs, out, min_speedup, per_problem, include_unmeasured) -> None:
    from kernelagent.errors import UserError
    from kernelagent.rl.sft import export_sft, stats_path_for

    missing = [str(r) for r in runs if not r.exists()]
    if missing:
        raise UserError(f"not found: {', '.join(missing)}")
    stats = export_sft(runs, min_speedup, out, per_problem=per_problem,
                       include_unmeasured=include_unmeasured)
    if not stats["runs_read"]:
        raise UserError("no run folders (trajectory.json + summary.json) found")
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(stats["skipped"].items())) or "none"
    typer.echo(f"{stats['rows']} rows from {stats['runs_read']} runs ({stats['problems']} problems; "
               f"skipped: {skipped}): {out}; stats: {stats_path_for(out)}")

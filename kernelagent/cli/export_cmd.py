"""`kernelagent export sft RUN... --min-speedup X --out sft.jsonl`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import Command, finite, typer_app
from kernelagent.text import plural

export_app = typer_app(help="Export training data from agent runs.", no_args_is_help=True)


@export_app.command("sft", cls=Command)
def sft(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN...", help="Run folders of `kernelagent optimize` (or folders holding them).")],
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="JSONL file of chat rows; statistics go to <stem>.stats.json beside it.")] = Path("sft.jsonl"),
    min_speedup: Annotated[float, typer.Option("--min-speedup", metavar="X", callback=finite(0), help="Keep kernels at least this fast vs TorchInductor (else eager). Runs without meaningful timings (CPU) pass only at 0 or with --include-unmeasured.")] = 1.0,
    per_problem: Annotated[Optional[int], typer.Option("--per-problem", min=1, metavar="N", help="Rows kept per problem (the most concise reasoning first). Default 1; no limit with --all-winners.", show_default=False)] = None,
    all_winners: Annotated[bool, typer.Option("--all-winners", help="From search runs (--strategy best-of-n/beam/evolve): a row for every correct node at least --min-speedup fast, not only the winner's path.")] = False,
    include_unmeasured: Annotated[bool, typer.Option("--include-unmeasured", help="Keep verified kernels whose timings mean nothing (CPU runs).")] = False,
    split: Annotated[float, typer.Option("--split", min=0.0, max=1.0, help="Train fraction of the problem split (the rule `dataset prompts` uses: a hash of seed and the problem's content).")] = 0.8,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the split.")] = 0,
    include_test: Annotated[bool, typer.Option("--include-test", help="Keep rows of test-split problems too (left out by default).")] = False,
    max_turns: Annotated[Optional[int], typer.Option("--max-turns", min=1, help="Drop runs with more assistant turns than this.", show_default=False)] = None,
    max_reasoning_chars: Annotated[Optional[int], typer.Option("--max-reasoning-chars", min=0, help="Drop rows whose reasoning (assistant prose, code cut out) is longer.", show_default=False)] = None,
    reasoning_percentile: Annotated[Optional[float], typer.Option("--reasoning-percentile", min=0.0, max=100.0, help="Per problem, keep rows at or under this percentile of reasoning length.", show_default=False)] = None,
) -> None:
    """Turn verified agent runs into chat-format fine-tuning rows."""
    from kernelagent.cli import run_guarded

    run_guarded(_sft, runs=runs, out=out, min_speedup=min_speedup, per_problem=per_problem,
                include_unmeasured=include_unmeasured, split=split, seed=seed, include_test=include_test,
                max_turns=max_turns, max_reasoning_chars=max_reasoning_chars,
                reasoning_percentile=reasoning_percentile, all_winners=all_winners)


def _sft(*, runs, out, min_speedup, per_problem, include_unmeasured, split, seed, include_test,
         max_turns, max_reasoning_chars, reasoning_percentile, all_winners=False) -> None:
    from kernelagent.errors import EXIT_FAILED, UserError
    from kernelagent.rl.sft import export_sft, stats_path_for

    missing = [str(r) for r in runs if not r.exists()]
    if missing:
        raise UserError(f"not found: {', '.join(missing)}")
    if per_problem is None:
        per_problem = 1_000_000 if all_winners else 1
    stats = export_sft(runs, min_speedup, out, per_problem=per_problem, all_winners=all_winners,
                       include_unmeasured=include_unmeasured, split=split, seed=seed,
                       include_test=include_test, max_turns=max_turns,
                       max_reasoning_chars=max_reasoning_chars, reasoning_percentile=reasoning_percentile)
    if not stats["runs_read"]:
        raise UserError("no run folders (trajectory.json + summary.json) found")
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(stats["skipped"].items())) or "none"
    if not stats["rows"]:
        hint = ("; runs without meaningful timings (CPU) pass only with --include-unmeasured or --min-speedup 0"
                if stats["skipped"].get("unmeasured") else "")
        raise UserError(f"no row to export from {plural(stats['runs_read'], 'run')} (dropped: {skipped}){hint}; "
                        f"nothing written", exit_code=EXIT_FAILED)
    typer.echo(f"{plural(stats['rows'], 'row')} from {plural(stats['runs_read'], 'run')} "
               f"({plural(stats['problems'], 'problem')}; "
               f"dropped: {skipped}): {out}; stats: {stats_path_for(out)}")

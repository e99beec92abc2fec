"""`kernelagent report RUN`: regenerate a bench run's reports from the store;
`kernelagent report --compare RUN_A RUN_B`: two runs side by side.

RUN is a run directory (it holds run.json), or a run id in the store (--store, default
$KERNELAGENT_CACHE_DIR/bench.sqlite). Thin: kernelagent.bench.report does the work.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.errors import EXIT_USAGE, UserError
from kernelagent.text import terminal_text


def report(
    run: Annotated[Optional[str], typer.Argument(metavar="RUN", help="Run directory or run id.", show_default=False)] = None,
    compare: Annotated[Optional[tuple[str, str]], typer.Option("--compare", metavar="RUN_A RUN_B", help="Compare two runs side by side.", show_default=False)] = None,
    store: Annotated[Optional[Path], typer.Option("--store", metavar="PATH", help="SQLite store (default: the user-level one, or the one a run directory names).", show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="Where to write (default: the run's directory; runs/compare/A-vs-B for --compare).", show_default=False)] = None,
    list_runs: Annotated[bool, typer.Option("--list", help="List the runs in the store.")] = False,
) -> None:
    """Write summary.json, problems.csv and report.html for a bench run (or compare two runs)."""
    import sqlite3

    from kernelagent.bench.folder import check_folder
    from kernelagent.bench.report import load_run, resolve_run, restrict_to_shared, write_compare, write_reports
    from kernelagent.bench.store import damaged, default_store_path, open_store

    def fail(message: str) -> typer.Exit:
        typer.echo(terminal_text(f"error: {message}"), err=True)
        return typer.Exit(EXIT_USAGE)

    path = store or default_store_path()
    try:
        if list_runs:
            if not Path(path).is_file():
                raise UserError(f"no bench store at {path}")
            with open_store(path) as db:
                for r in db.runs():
                    done = sum(1 for p in db.problems(r["id"]) if p["record"] is not None)
                    total = len(db.problems(r["id"]))
                    typer.echo(f"{r['id']}  {r['mode']}  {r['status']}  {done}/{total} problems  {r['out_dir']}")
            raise typer.Exit(0)
        if compare:
            if run is not None:
                raise UserError("give either RUN or --compare RUN_A RUN_B")
            loaded = []
            for ref in compare:
                path, run_id = resolve_run(ref, str(store) if store else None)
                with open_store(path) as db:
                    loaded.append(load_run(db, run_id))
            a, b = loaded
            note = restrict_to_shared(a, b)
            if note:
                typer.echo(f"note: {note}", err=True)
            target = out or Path("runs") / "compare" / _safe(f"{a['run']['id']}-vs-{b['run']['id']}")
            check_folder(target, f"--out {target}" if out else f"the folder {target}")
            paths = write_compare(a, b, target)
            typer.echo(f"compare: {paths['html']}")
            raise typer.Exit(0)
        if run is None:
            raise UserError("give RUN (a run directory or id), --compare RUN_A RUN_B, or --list")
        path, run_id = resolve_run(run, str(store) if store else None)
        with open_store(path) as db:
            data = load_run(db, run_id)
            target = out or Path(data["run"]["out_dir"] or Path("runs") / "bench" / run_id)
            check_folder(target, f"--out {target}" if out else f"the run's folder {target}",
                         "" if out else ": give --out DIR")
            paths = write_reports(db, run_id, target)
        typer.echo(f"report: {paths['html']} (summary: {paths['summary']}, per problem: {paths['csv']})")
    except UserError as exc:
        raise fail(str(exc)) from None
    except sqlite3.DatabaseError as exc:  # a damaged page the open's check did not read
        raise fail(damaged(exc, path)) from None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)

"""`kernelagent verify`, `kernelagent regenerate`, `kernelagent init`: kernels kept in a
repository, checked and regenerated in CI. The logic is in kernelagent/ci/; these are the
typer faces. Exit codes: verify 0 all pass, 1 some fail; regenerate 0 every failing kernel
regenerated and passing, 3 some correct but short of target, 1 some still fail; 2 bad input
for all three (one line on stderr)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.errors import UserError

PathArg = Annotated[Optional[Path], typer.Argument(
    metavar="[PATH]", help="kernelagent.toml, or the folder holding it (default: the current folder).",
    show_default=False)]
Only = Annotated[Optional[list[str]], typer.Option(
    "--only", help="Only these kernels (by name; repeat or comma-separate).", show_default=False)]
StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", help="Bench store (SQLite) caching the results (default: $KERNELAGENT_CACHE_DIR/bench.sqlite).",
    show_default=False)]
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="auto, cpu, cuda or cuda:N (default: the manifest's `device`, else auto).", show_default=False)]
TrialsOpt = Annotated[Optional[int], typer.Option(
    "--trials", min=1, help="Correctness trials (default: the manifest's `trials`, else 5).", show_default=False)]
CacheOpt = Annotated[Optional[Path], typer.Option(
    "--cache-dir", help="The harness's baseline cache folder.", show_default=False)]
IsolationOpt = Annotated[str, typer.Option("--isolation", help="auto, bwrap or none.")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def verify(
    path: PathArg = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="Write JUnit XML here: one test case per kernel.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (the per-kernel lines go to stderr).")] = False,
    update_lock: Annotated[bool, typer.Option("--update-lock", help="Rewrite the lock from this run (the exit code still judges against the old lock).")] = False,
    only: Only = None,
    store: StoreOpt = None,
    device: DeviceOpt = None,
    trials: TrialsOpt = None,
    cache_dir: CacheOpt = None,
    isolation: IsolationOpt = "auto",
) -> None:
    """Re-evaluate every kernel of kernelagent.toml with the trusted harness; exit 1 if any fails."""
    from kernelagent.ci import outputs
    from kernelagent.ci.manifest import load_manifest
    from kernelagent.ci.session import open_cached_evaluator
    from kernelagent.ci.verify import run_verify

    if junit is not None and junit.is_dir():
        raise _fail(f"--junit {junit} is a folder; give a file name")
    err = sys.stderr if json_out else sys.stdout

    def progress(check) -> None:
        print(f"{check.status.upper():4}  {check.name}: {check.message()}"
              + (" (from the store)" if check.reused else ""), file=err, flush=True)

    try:
        manifest = load_manifest(path)
        with open_cached_evaluator(store=store, device=device or manifest.device, cache_dir=cache_dir,
                                   isolation=isolation, run_id=f"verify:{manifest.path}") as cached:
            report = run_verify(manifest, cached, update_lock=update_lock, only=only, trials=trials,
                                on_check=progress)
    except UserError as exc:
        raise _fail(str(exc), exc.exit_code) from None
    # Every output is written before the exit code: CI wants the report most when it fails.
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(outputs.junit_xml(report), encoding="utf-8")
    outputs.append_step_summary(outputs.markdown(report))
    print(outputs.console_lines(report)[-1], file=err, flush=True)
    if json_out:
        typer.echo(outputs.dumps(report.to_dict()))
    raise typer.Exit(report.exit_code)

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

from kernelagent.cli.core import (DaemonOpt, InductorModesOpt, JobsPerGpuOpt, MaxAutotuneOpt, ModelConcurrencyOpt,
                                  StageTimeoutOpt, TimeoutScaleOpt, folder, inductor_modes, stage_timeouts,
                                  warm_harness)
from kernelagent.errors import UserError
from kernelagent.text import plural, terminal_text

PathArg = Annotated[Optional[Path], typer.Argument(
    metavar="PATH", help="kernelagent.toml, or the folder holding it (default: the current folder).",
    show_default=False)]
Only = Annotated[Optional[list[str]], typer.Option(
    "--only", metavar="NAME", help="Only these kernels (by name; repeat or comma-separate).", show_default=False)]
StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", metavar="FILE", help="Bench store (SQLite) caching the results (default: $KERNELAGENT_CACHE_DIR/bench.sqlite).",
    show_default=False)]
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N (default: the manifest's `device`, else auto).", show_default=False)]
TrialsOpt = Annotated[Optional[int], typer.Option(
    "--trials", min=1, metavar="N", help="Correctness trials (default: the manifest's `trials`, else 5).", show_default=False)]
CacheOpt = Annotated[Optional[Path], typer.Option(
    "--cache-dir", metavar="DIR", callback=folder, help="The harness's baseline cache folder.", show_default=False)]
IsolationOpt = Annotated[str, typer.Option("--isolation", metavar="auto|bwrap|namespaces|none", help="Sandbox of the harness (see eval --help).")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(terminal_text(f"error: {message}"), err=True)
    return typer.Exit(code)


def verify(
    path: PathArg = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", metavar="FILE", help="Write JUnit XML here: one test case per kernel.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (the per-kernel lines go to stderr).")] = False,
    update_lock: Annotated[bool, typer.Option("--update-lock", help="Rewrite the lock from this run (the exit code still judges against the old lock).")] = False,
    only: Only = None,
    store: StoreOpt = None,
    device: DeviceOpt = None,
    trials: TrialsOpt = None,
    cache_dir: CacheOpt = None,
    isolation: IsolationOpt = "auto",
    max_autotune: MaxAutotuneOpt = False,
    modes: InductorModesOpt = None,
    jobs_per_gpu: JobsPerGpuOpt = 0,
    timeout_scale: Annotated[Optional[float], TimeoutScaleOpt] = None,
    stage_timeout: Annotated[Optional[list[str]], StageTimeoutOpt] = None,
    daemon: DaemonOpt = None,
) -> None:
    """Re-evaluate every kernel of kernelagent.toml with the trusted harness; exit 1 if any fails."""
    from kernelagent.ci import outputs
    from kernelagent.ci.manifest import load_manifest
    from kernelagent.ci.session import open_cached_evaluator
    from kernelagent.ci.verify import preflight, run_verify

    if junit is not None:
        why = _unwritable(junit)
        if why:  # found now, before the lock is written or anything is said
            raise _fail(f"--junit {junit}: {why}")
    err = sys.stderr if json_out else sys.stdout

    def progress(check) -> None:
        print(outputs.progress_line(check), file=err, flush=True)

    try:
        compile_modes = inductor_modes(modes, max_autotune)
        manifest = load_manifest(path)
        preflight(manifest, only)  # bad input: one line on stderr, nothing on stdout before it
        with open_cached_evaluator(store=store, device=device or manifest.device, cache_dir=cache_dir,
                                   isolation=isolation, run_id=f"verify:{manifest.path}",
                                   jobs_per_gpu=jobs_per_gpu, daemon=warm_harness(daemon)) as cached:
            why = (getattr(cached.evaluator, "concurrency", None) or {}).get("why")
            print(terminal_text(f"verify: {cached.jobs} evaluation{'s' if cached.jobs != 1 else ''} at once"
                                + (f" ({why})" if why else "")), file=err, flush=True)
            report = run_verify(manifest, cached, update_lock=update_lock, only=only, trials=trials,
                                on_check=progress, compile_modes=compile_modes,
                                timeouts=stage_timeouts(timeout_scale, stage_timeout))
    except UserError as exc:
        raise _fail(str(exc), exc.exit_code) from None
    # Every output is written before the exit code: CI wants the report most when it fails.
    try:
        if junit is not None:
            from kernelagent.files import write_text

            write_text(junit, outputs.junit_xml(report), option="--junit")
        outputs.append_step_summary(outputs.markdown(report))
    except OSError as exc:  # the results are in the store and the lock: a rerun is instant
        raise _fail(f"cannot write the report: {exc}") from None
    except UserError as exc:
        raise _fail(str(exc)) from None
    print(outputs.console_lines(report)[-1], file=err, flush=True)
    if json_out:
        typer.echo(outputs.dumps(report.to_dict()))
    raise typer.Exit(report.exit_code)


def _unwritable(target: Path) -> str | None:
    """Why a report file cannot be written there, or None: checked before any work, so that a
    typo in --junit does not cost a run (and leave a lock written behind an error)."""
    import os

    if target.is_dir():
        return "it is a folder; give a file name"
    if target.exists():
        return None if os.access(target, os.W_OK) else "the file is not writable"
    for folder in target.parents:
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a folder"
            if not os.access(folder, os.W_OK | os.X_OK):
                return f"the folder {folder} is not writable"
            break
    from kernelagent.files import probe_write

    return probe_write(target)


def regenerate(
    path: PathArg = None,
    only: Only = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be regenerated, and why; change nothing.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="Each kernel's trajectory and summary go to OUT/<name>/ (default: runs/regenerate-<timestamp>).", show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", envvar="KERNELAGENT_MODEL", help="litellm model string (default: the manifest's `model`), or scripted:FILE[,FILE...] to play files back as the model's replies (no key needed).", show_default=False)] = None,
    api_base: Annotated[Optional[str], typer.Option("--api-base", metavar="URL", envvar="KERNELAGENT_API_BASE", help="OpenAI-compatible server (default: the manifest's `api_base`).", show_default=False)] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", metavar="KEY", envvar="KERNELAGENT_API_KEY", help="API key (default: the provider's usual variable).", show_default=False)] = None,
    model_timeout: Annotated[float, typer.Option("--model-timeout", min=0.1, metavar="SECONDS", help="Seconds to wait for one model reply, per attempt (a call makes --max-retries + 1 attempts, with a backoff of at most 60 s between them).")] = 300.0,
    max_retries: Annotated[int, typer.Option("--max-retries", min=0, metavar="N", help="Retries of a model call on rate limits, timeouts, connection errors and 5xx.")] = 6,
    retry_backoff: Annotated[float, typer.Option("--retry-backoff", min=0.0, metavar="SECONDS", help="Base seconds of the exponential retry backoff.")] = 2.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (progress goes to stderr).")] = False,
    strategy: Annotated[Optional[str], typer.Option("--strategy", metavar="single|best-of-n|beam|evolve", help="Search strategy (default: the manifest's `strategy`, else single); see optimize --help.", show_default=False)] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, metavar="N", help="Model calls per round (default: the manifest's `samples`, else 1).", show_default=False)] = None,
    model_concurrency: ModelConcurrencyOpt = None,
    max_turns: Annotated[Optional[int], typer.Option("--max-turns", min=1, metavar="N", help="Most model calls per kernel (default: the manifest's `max_turns`, else 10).", show_default=False)] = None,
    store: StoreOpt = None,
    device: DeviceOpt = None,
    trials: TrialsOpt = None,
    cache_dir: CacheOpt = None,
    isolation: IsolationOpt = "auto",
    daemon: DaemonOpt = None,
) -> None:
    """Run the agent on the kernels verify fails, starting from each current kernel; replace a kernel only with a better verified one."""
    from kernelagent.ci import outputs
    from kernelagent.ci.manifest import load_manifest
    from kernelagent.ci.regenerate import run_regenerate
    from kernelagent.ci.session import open_cached_evaluator

    err = sys.stderr if json_out else sys.stdout

    def say(line: str) -> None:  # kernel names, reasons and the agent's details: a candidate's text
        print(terminal_text(line), file=err, flush=True)

    if out is not None and out.exists() and not out.is_dir():
        raise _fail(f"--out {out} exists and is not a folder")
    try:
        manifest = load_manifest(path)
        if max_turns is not None:
            import dataclasses

            manifest = dataclasses.replace(manifest, max_turns=max_turns)
        if strategy is not None or samples is not None or model_concurrency is not None:
            import dataclasses

            from kernelagent.orchestrate import check_strategy

            manifest = dataclasses.replace(manifest, strategy=strategy or manifest.strategy,
                                           samples=samples or manifest.samples,
                                           model_concurrency=model_concurrency or manifest.model_concurrency)
            try:
                check_strategy(manifest.strategy, manifest.samples)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        factory = None
        if not dry_run:
            from kernelagent.models import make_model

            settings = dict(api_base=api_base or manifest.api_base, api_key=api_key, timeout=model_timeout,
                            max_retries=max_retries, backoff_base=retry_backoff, temperature=manifest.temperature)
            name = model or manifest.model
            make_model(name, **settings)  # no model, no key: one line and exit 2, before any work

            def factory():
                return make_model(name, **settings)
        with open_cached_evaluator(store=store, device=device or manifest.device, cache_dir=cache_dir,
                                   isolation=isolation, run_id=f"regenerate:{manifest.path}",
                                   daemon=warm_harness(daemon)) as cached:
            report = run_regenerate(manifest, cached, model_factory=factory, out=out, only=only, dry_run=dry_run,
                                    trials=trials, device=device or manifest.device, say=say)
    except UserError as exc:
        raise _fail(str(exc), exc.exit_code) from None
    if not report.items:
        say("regenerate: every kernel passes; nothing to regenerate")
    elif dry_run:
        for item in report.items:
            say(f"would regenerate {item.name}: {'; '.join(item.reasons)}")
    else:
        counts = {}
        for item in report.items:
            counts[item.outcome] = counts.get(item.outcome, 0) + 1
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        say(f"regenerate: {plural(len(report.items), 'kernel')}: {summary}"
            + (f"; lock updated: {manifest.lock_path}" if report.lock_written else ""))
    if json_out:
        typer.echo(outputs.dumps(report.to_dict()))
    raise typer.Exit(report.exit_code)


def init(
    path: Annotated[Optional[Path], typer.Argument(metavar="DIR", help="Where kernelagent.toml goes (default: the current folder).", show_default=False)] = None,
    problems: Annotated[Optional[Path], typer.Option("--problems", metavar="DIR", help="Folder of problem files (default: DIR/problems).", show_default=False)] = None,
    kernels: Annotated[Optional[Path], typer.Option("--kernels", metavar="DIR", help="Folder of kernels, named like their problems (default: DIR/kernels).", show_default=False)] = None,
    from_bench: Annotated[Optional[str], typer.Option("--from-bench", metavar="RUN", help="Take a bench run's best kernels (a run directory or id); copies them into DIR/problems and DIR/kernels.", show_default=False)] = None,
    store: StoreOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing kernelagent.toml.")] = False,
) -> None:
    """Create kernelagent.toml from a folder of problems and kernels, or from a bench run."""
    from kernelagent.ci.init import init_from_bench, init_from_folders

    root = path or Path.cwd()
    try:
        if from_bench:
            if problems or kernels:
                raise UserError("--from-bench takes the kernels from the run: leave out --problems and --kernels")
            result = init_from_bench(root, from_bench, store=str(store) if store else None, force=force)
        else:
            result = init_from_folders(root, problems or root / "problems", kernels or root / "kernels", force=force)
    except UserError as exc:
        raise _fail(str(exc), exc.exit_code) from None
    for note in result.skipped:
        typer.echo(terminal_text(f"skipped {note}"))
    typer.echo(f"wrote {result.manifest}: {plural(len(result.pairs), 'kernel')}; check "
               f"{'it' if len(result.pairs) == 1 else 'them'} with `kernelagent verify {root}`")

"""`kernelagent bench DIR`: every problem under DIR, with the agent or with existing candidates.

A plain function with typer options (registered by kernelagent/cli/__init__.py). Thin: it
resolves options and calls kernelagent.bench.run_bench. Exit codes: 0 the batch finished (the
metrics are the result, whatever they are), 2 bad input or configuration, 5 (agent mode) the
model did not answer (timeout and retries spent): the batch stopped, and goes on with the same
command, 130 interrupted
(resume with the same command, or --resume RUN).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import (InductorModesOpt, JobsPerGpuOpt, MaxAutotuneOpt, ModelConcurrencyOpt, SamplesOpt,
                                  StageTimeoutOpt, StrategyOpt, TimeoutScaleOpt, finite, folder, inductor_modes,
                                  interrupted, stage_timeouts, warm_harness)
from kernelagent.cli.optimize_cmd import Mode
from kernelagent.errors import EXIT_MODEL_UNAVAILABLE, EXIT_USAGE, UserError
from kernelagent.text import plural, terminal_text


def bench(
    directory: Annotated[Optional[Path], typer.Argument(metavar="DIR", help="Benchmark directory: KernelBench's level1/ to level3/ layout, ours (benchmarks/), or a flat folder of problems.", show_default=False)] = None,
    candidates: Annotated[Optional[Path], typer.Option("--candidates", metavar="CDIR", help="Evaluate existing candidates instead of running the agent: CDIR/<problem-stem>.py, or samples CDIR/<problem-stem>/*.py (also under CDIR/levelN/).", show_default=False)] = None,
    levels: Annotated[Optional[str], typer.Option("--levels", metavar="LEVELS", help="Levels to run, e.g. 1,2 (default: all but KernelBench's level 4, which needs transformers and hub access: --levels 4 to include it).", show_default=False)] = None,
    filter_glob: Annotated[Optional[str], typer.Option("--filter", metavar="GLOB", help="Only problems whose key (level1/19_ReLU) or stem matches this glob.", show_default=False)] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, metavar="N", help="At most N problems (after --levels/--filter).", show_default=False)] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", metavar="GPUS", help="GPU indices, e.g. 0,1; 'cpu'; default: every visible GPU (the CPU when there is none).", show_default=False)] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, metavar="N", help="Agent mode: problems, and so model calls, in flight at once.")] = 4,
    jobs_per_gpu: JobsPerGpuOpt = 0,
    cpu_workers: Annotated[int, typer.Option("--cpu-workers", min=1, metavar="N", help="Harness workers when running on the CPU (with --ray: per node of a cluster without GPUs).")] = 1,
    ray_address: Annotated[Optional[str], typer.Option("--ray", metavar="ADDRESS", help="Run the evaluations on a Ray cluster (one harness per GPU on every node): its address, e.g. 10.0.0.1:6379 or ray://host:10001, or 'auto' (the cluster this machine runs, else a new local one). Agent mode: the agent loops stay here, their evaluations go to the cluster. Needs the rl extra.", show_default=False)] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="RUN", help="Resume a run by id (its stored settings are used).", show_default=False)] = None,
    run_name: Annotated[Optional[str], typer.Option("--run", metavar="NAME", help="Name the run (default: derived from its settings, so the same command resumes it).", show_default=False)] = None,
    store: Annotated[Optional[Path], typer.Option("--store", metavar="PATH", help="SQLite store (default: $KERNELAGENT_CACHE_DIR/bench.sqlite, else ~/.cache/kernelagent/bench.sqlite).", show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="Run directory for reports and agent outputs (default: the folder the store recorded for the run, else runs/bench/<run id>). A folder that holds another run's report is refused unless --force.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --out replace another run's report in that folder.")] = False,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", envvar="KERNELAGENT_MODEL", help="litellm model string, e.g. openai/gpt-4o, or openai/<name> with --api-base; or scripted:FILE[,FILE...] to play files back as the model's replies (no key needed).", show_default=False)] = None,
    api_base: Annotated[Optional[str], typer.Option("--api-base", metavar="URL", envvar="KERNELAGENT_API_BASE", help="Base URL of an OpenAI-compatible server (vLLM, SGLang, ...).", show_default=False)] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", metavar="KEY", envvar="KERNELAGENT_API_KEY", help="API key (default: the provider's usual variable).", show_default=False)] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="tools: function calling; text: code blocks only; auto: both.")] = Mode.auto,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, metavar="N", help="Most model calls per problem.")] = 20,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", min=1, metavar="N", help="Most prompt+completion tokens per problem.", show_default=False)] = None,
    max_cost: Annotated[Optional[float], typer.Option("--max-cost", min=0.0, metavar="USD", callback=finite(0), help="Most USD per problem.", show_default=False)] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", min=1.0, metavar="SECONDS", callback=finite(1), help="Wall-clock seconds per problem for the agent loop.", show_default=False)] = None,
    target_speedup: Annotated[float, typer.Option("--target-speedup", min=0.0, metavar="X", callback=finite(0), help="Speedup over TorchInductor that counts as success.")] = 1.0,
    trials: Annotated[int, typer.Option("--trials", min=1, metavar="N", help="Correctness trials per evaluation.")] = 5,
    quick_trials: Annotated[int, typer.Option("--quick-trials", min=1, metavar="N", help="Agent: correctness trials for run_tests and profile.")] = 2,
    timing: Annotated[bool, typer.Option("--timing/--no-timing", help="Time candidates (and baselines).")] = True,
    baselines: Annotated[bool, typer.Option("--baselines/--no-baselines", help="Time eager and torch.compile baselines (cached).")] = True,
    max_autotune: MaxAutotuneOpt = False,
    modes: InductorModesOpt = None,
    backend: Annotated[str, typer.Option("--backend", metavar="triton|cuda", help="Kernel language: Triton, or CUDA C++ built with load_inline.")] = "triton",
    isolation: Annotated[str, typer.Option("--isolation", metavar="auto|bwrap|namespaces|none", help="Sandbox: auto (bubblewrap around the harness where it works, plus per-job namespaces where they work), bwrap (require bubblewrap), namespaces (require per-job namespaces), none (no sandbox; a warning says so).")] = "auto",
    daemon: Annotated[Optional[bool], typer.Option("--daemon/--no-daemon", help="Each device's evaluations go to this user's warm harness of its settings (one per GPU; started now where none answers; each ends after 10 idle minutes), so the next batch finds them warm. Default: on, unless $KERNELAGENT_DAEMON=0 (--no-daemon: servers of the run's own). Not with --ray (its workers hold their own harnesses).", show_default=False)] = None,
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", metavar="DIR", callback=folder, help="Baseline cache directory (default ~/.cache/kernelagent).", show_default=False)] = None,
    model_timeout: Annotated[float, typer.Option("--model-timeout", min=0.1, metavar="SECONDS", callback=finite(0.1), help="Seconds to wait for one model reply, per attempt (a call makes --max-retries + 1 attempts, with a backoff of at most 60 s between them).")] = 300.0,
    max_retries: Annotated[int, typer.Option("--max-retries", min=0, max=100, metavar="N", help="Retries of a model call on rate limits, timeouts and 5xx.")] = 6,
    retry_backoff: Annotated[float, typer.Option("--retry-backoff", min=0.0, metavar="SECONDS", callback=finite(0), help="Base seconds of the exponential retry backoff.")] = 2.0,
    temperature: Annotated[Optional[float], typer.Option("--temperature", metavar="X", callback=finite(0), help="Sampling temperature.", show_default=False)] = None,
    strategy: StrategyOpt = "single",
    samples: SamplesOpt = 1,
    model_concurrency: ModelConcurrencyOpt = None,
    live: Annotated[Optional[bool], typer.Option("--live/--no-live", help="Live progress panel (default: on a terminal).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the final lines.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's metrics as one JSON object at the end.")] = False,
    timeout_scale: Annotated[Optional[float], TimeoutScaleOpt] = None,
    stage_timeout: Annotated[Optional[list[str]], StageTimeoutOpt] = None,
) -> None:
    """Run the agent (or evaluate existing candidates) on every problem under DIR, with resume and reports."""
    import sqlite3

    from kernelagent.bench import BenchSpec, Session, run_bench
    from kernelagent.bench.progress import BenchProgress
    from kernelagent.harness import HarnessStartError

    def fail(message: str) -> typer.Exit:
        typer.echo(terminal_text(f"error: {message}"), err=True)
        return typer.Exit(EXIT_USAGE)

    if directory is None and resume is None:
        raise fail("give a benchmark directory DIR, or --resume RUN")
    if isolation not in ("auto", "bwrap", "namespaces", "none"):
        raise fail(f"--isolation must be auto, bwrap, namespaces or none (got {isolation!r})")
    if ray_address is not None:
        if not ray_address.strip():
            raise fail("--ray takes a cluster address (host:6379, ray://host:10001) or 'auto'")
        if gpus is not None:
            raise fail("--gpus and --ray do not go together: with --ray every GPU of the cluster is used")
        if daemon:
            raise fail("--daemon and --ray do not go together: the cluster's workers hold their own harnesses")
        try:  # only with --ray: the import takes a second
            import ray  # noqa: F401
        except ImportError:
            raise fail("--ray needs the ray package: pip install 'kernelagent[rl]' "
                       "(on the driver and on every worker)") from None
    if backend not in ("triton", "cuda"):
        raise fail(f"--backend must be triton or cuda (got {backend!r})")
    try:
        compile_modes = inductor_modes(modes, max_autotune)
    except UserError as exc:
        raise fail(str(exc)) from None
    if strategy != "single" or samples != 1:
        from kernelagent.orchestrate import check_strategy

        if candidates is not None:
            raise fail("--strategy and --samples are for agent mode (no --candidates)")
        try:
            check_strategy(strategy, samples)
        except ValueError as exc:
            raise fail(str(exc)) from None
    # The run id hashes the spec: the two settings --max-autotune has always had keep their ids.
    max_autotune = compile_modes == ("default", "max-autotune-no-cudagraphs")
    extra_modes = None if compile_modes in (("default",), ("default", "max-autotune-no-cudagraphs")) \
        else list(compile_modes)
    spec = None
    if directory is not None and resume is None:
        spec = BenchSpec(root=str(directory), candidates=str(candidates) if candidates else None, levels=levels,
                         filter=filter_glob, limit=limit, trials=trials, timing=timing, baselines=baselines,
                         max_autotune=max_autotune, inductor_modes=extra_modes, backend=backend, model=model, api_base=api_base, agent_mode=mode.value,
                         max_turns=max_turns, max_tokens=max_tokens, max_cost=max_cost, timeout=timeout,
                         target_speedup=target_speedup, quick_trials=quick_trials, temperature=temperature,
                         timeouts=stage_timeouts(timeout_scale, stage_timeout), strategy=strategy,
                         samples=samples, model_concurrency=model_concurrency)
    # The warm harness per device is the CLI's default (issue 59: `--no-daemon` or
    # KERNELAGENT_DAEMON=0 for servers of the run's own); a Ray cluster's workers hold their own
    # harnesses, so with --ray it is off (an explicit --daemon was refused above).
    warm = False if ray_address is not None else warm_harness(daemon)
    session = Session(gpus=gpus, cpu_workers=cpu_workers, ray=ray_address.strip() if ray_address else None,
                      isolation=isolation, daemon=warm,
                      cache_dir=str(cache_dir) if cache_dir else None, store=str(store) if store else None,
                      out=str(out) if out else None, concurrency=concurrency, jobs_per_gpu=jobs_per_gpu,
                      run_name=run_name, api_key=api_key, force=force,
                      model_timeout=model_timeout, max_retries=max_retries, retry_backoff=retry_backoff)
    try:
        from kernelagent.bench.discover import check_root, discover
        from kernelagent.devices import check_gpu_list

        # What is wrong with DIR (or RUN) first, then what is missing for the agent.
        checked = _resumed_spec(resume, directory, store) if resume is not None else spec
        if directory is not None:
            check_root(directory)
        if checked is not None and not discover(checked.root, checked.levels, checked.filter, checked.limit):
            raise UserError(f"no problems found under {checked.root}"
                            + (" with those --levels/--filter" if checked.levels or checked.filter else ""))
        if checked is not None and checked.mode == "agent":
            _check_model(checked, session)  # a missing model or key: one line, before anything starts
        # A GPU that is not there: one line. None at all: the CPU, which the progress names.
        if ray_address is None:
            check_gpu_list(gpus, quiet=True)
        progress = BenchProgress(live=live, quiet=quiet)
        outcome = run_bench(spec, session, resume=resume, progress=progress)
    except UserError as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # a bad --gpus
        raise fail(str(exc)) from None
    except sqlite3.DatabaseError as exc:  # a damaged page the open's check did not read
        from kernelagent.bench.store import damaged, default_store_path

        raise fail(damaged(exc, store or default_store_path())) from None
    except HarnessStartError as exc:
        raise fail(f"the evaluation harness could not start: {str(exc).splitlines()[0]}") from None
    except KeyboardInterrupt:
        raise interrupted("interrupted: finished work is in the store; run the same command again "
                          "(or --resume) to go on") from None
    m = outcome.metrics
    if as_json:
        typer.echo(json.dumps({"run_id": outcome.run_id, "out_dir": str(outcome.out_dir),
                               "evaluations": outcome.evaluations, "reused": outcome.reused,
                               "skipped": outcome.skipped, "resubmitted": outcome.resubmitted, "metrics": m},
                              default=str))
    else:
        rate = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        geo = m["geomean_speedup"]["inductor"]
        typer.echo(f"run {outcome.run_id}: {plural(m['problems'], 'problem')}, compiled {rate(m['compile_rate'])}, "
                   f"correct {rate(m['correctness_rate'])}, fast_1.0 vs inductor "
                   f"{rate(m['fast_p']['inductor']['1.0'])} on the lower bound "
                   f"({rate(m['fast_p_point']['inductor']['1.0'])} on the point estimate), geomean vs inductor "
                   f"{'–' if geo is None else f'{geo:.3f}x'}; {plural(outcome.evaluations, 'evaluation')}, "
                   f"{outcome.reused} from the store, {plural(outcome.skipped, 'problem')} already done")
        if outcome.resubmitted:
            typer.echo(f"{plural(outcome.resubmitted, 'evaluation')} sent to another worker after "
                       f"{'its' if outcome.resubmitted == 1 else 'theirs'} was lost")
        for item in m.get("skipped") or []:
            typer.echo(terminal_text(f"skipped {item['key']}: {item['reason']}"))
        typer.echo(f"report: {outcome.out_dir / 'report.html'}")
    if outcome.model_unavailable is not None:
        typer.echo(terminal_text(f"error: the model did not answer, the batch stopped ({outcome.model_unavailable}); "
                                 f"run the same command again (or --resume {outcome.run_id}) to go on"), err=True)
        raise typer.Exit(EXIT_MODEL_UNAVAILABLE)
    raise typer.Exit(0)


def _resumed_spec(resume: str, directory: Path | None, store: Path | None):
    """--resume RUN: the run's own settings (from the store). DIR may be given, and must then be
    the run's benchmark directory; the other settings on the command line are not used."""
    from kernelagent.bench import BenchSpec
    from kernelagent.bench.store import default_store_path, open_store

    path = store or default_store_path()
    if not Path(path).is_file():
        raise UserError(f"no run {resume!r} in the store {path}: there is no store there (give --store)")
    with open_store(path) as db:
        run = db.run(resume)
    if run is None:
        raise UserError(f"no run {resume!r} in the store {path}")
    spec = BenchSpec(**run["spec"])
    if directory is not None and Path(directory).resolve() != Path(spec.root).resolve():
        raise UserError(f"--resume {resume} is a run over {spec.root}, not {directory}: leave DIR out "
                        "(a resumed run keeps its own settings)")
    return spec


def _check_model(spec, session) -> None:
    from kernelagent.models import make_model

    make_model(spec.model, api_base=spec.api_base, api_key=session.api_key, timeout=session.model_timeout,
               max_retries=session.max_retries, backoff_base=session.retry_backoff,
               temperature=spec.temperature).check_reachable()

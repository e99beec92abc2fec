"""`kernelagent optimize PROBLEM`: run the agent on one problem (or, with --whole-model, on a
whole model's hottest regions: kernelagent/orchestrate/whole_model.py).

A plain function with typer options; kernelagent/cli/__init__.py registers it with
`app.command("optimize")(optimize)`. Exit codes: 0 correct and meets the target, 3 correct
but short of it, 1 no correct kernel, 2 bad input or configuration (one line on stderr),
5 the model did not answer (timeout and retries spent) before any kernel of its was judged,
130 interrupted (what was kept, and how to go on, in one line on stderr).
"""

from __future__ import annotations

import json
import logging
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import (InductorModesOpt, MaxAutotuneOpt, ModelConcurrencyOpt, SamplesOpt,
                                  StageTimeoutOpt, StrategyOpt, TimeoutScaleOpt, finite, inductor_modes, interrupted,
                                  stage_timeouts)
from kernelagent.errors import EXIT_USAGE, UserError
from kernelagent.text import terminal_text


class Mode(str, Enum):
    tools = "tools"
    text = "text"
    auto = "auto"


def _fail(message: str) -> typer.Exit:
    typer.echo(terminal_text(f"error: {message}"), err=True)
    return typer.Exit(EXIT_USAGE)


def optimize(
    ctx: typer.Context,
    problem: Annotated[Path, typer.Argument(metavar="PROBLEM", help="KernelBench-format problem file (class Model, get_inputs, get_init_inputs).", show_default=False)],
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", envvar="KERNELAGENT_MODEL", help="litellm model string, e.g. openai/gpt-4o, anthropic/claude-sonnet-4-5, or openai/<name> with --api-base; or scripted:FILE[,FILE...] to play files back as the model's replies (a .py file: a kernel; no key needed).", show_default=False)] = None,
    api_base: Annotated[Optional[str], typer.Option("--api-base", metavar="URL", envvar="KERNELAGENT_API_BASE", help="Base URL of an OpenAI-compatible server (vLLM, SGLang, ...), e.g. http://localhost:8000/v1.", show_default=False)] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", metavar="KEY", envvar="KERNELAGENT_API_KEY", help="API key (default: the provider's usual variable, e.g. OPENAI_API_KEY).", show_default=False)] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="tools: function calling; text: code blocks only; auto: tools, and code blocks are evaluated too.")] = Mode.auto,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, metavar="N", help="Most model calls.")] = 20,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", min=1, metavar="N", help="Most prompt+completion tokens over the run.", show_default=False)] = None,
    max_cost: Annotated[Optional[float], typer.Option("--max-cost", min=0.0, metavar="USD", callback=finite(0), help="Most USD spent (litellm prices; 0 for unknown models).", show_default=False)] = None,
    timeout: Annotated[Optional[float], typer.Option("--timeout", min=1.0, metavar="SECONDS", callback=finite(1), help="Wall-clock seconds for the loop (the final verification runs after it).", show_default=False)] = None,
    target_speedup: Annotated[float, typer.Option("--target-speedup", min=0.0, metavar="X", callback=finite(0), help="Speedup over TorchInductor that counts as success.")] = 1.0,
    out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="Output folder (default: a new runs/<timestamp>-<problem>). A folder that already holds a run is refused unless --force.", show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N. An explicit GPU must exist; only auto falls back to the CPU (and says so).")] = "auto",
    trials: Annotated[int, typer.Option("--trials", min=1, metavar="N", help="Correctness trials for submit and the final verification.")] = 5,
    quick_trials: Annotated[int, typer.Option("--quick-trials", min=1, metavar="N", help="Correctness trials for run_tests and profile.")] = 2,
    model_timeout: Annotated[float, typer.Option("--model-timeout", min=0.1, metavar="SECONDS", callback=finite(0.1), help="Seconds to wait for one model reply, per attempt (a call makes --max-retries + 1 attempts, with a backoff of at most 60 s between them).")] = 300.0,
    max_retries: Annotated[int, typer.Option("--max-retries", min=0, max=100, metavar="N", help="Retries of a model call on rate limits, timeouts, connection errors and 5xx.")] = 6,
    retry_backoff: Annotated[float, typer.Option("--retry-backoff", min=0.0, metavar="SECONDS", callback=finite(0), help="Base seconds of the exponential retry backoff.")] = 2.0,
    temperature: Annotated[Optional[float], typer.Option("--temperature", metavar="X", callback=finite(0), help="Sampling temperature (provider default if unset).", show_default=False)] = None,
    live: Annotated[Optional[bool], typer.Option("--live/--no-live", help="Live progress panel (default: on a terminal).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the final result line.")] = False,
    backend: Annotated[str, typer.Option("--backend", metavar="triton|cuda", help="Kernel language: Triton, or CUDA C++ built with load_inline.")] = "triton",
    strategy: StrategyOpt = "single",
    samples: SamplesOpt = 1,
    model_concurrency: ModelConcurrencyOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the search's random draws (evolve's parents).")] = 0,
    resume: Annotated[Optional[Path], typer.Option("--resume", metavar="DIR", help="Continue a killed or finished search in DIR, or with --whole-model an interrupted whole-model run (its strategy, samples, seed and regions; the budget flags are the new totals, counting what it spent).", show_default=False)] = None,
    whole_model: Annotated[bool, typer.Option("--whole-model", help="Plan the model (kernelagent plan), run the agent on its hottest regions in one budget, splice the verified kernels into OUT/model_optimized.py and verify it end to end against the original.")] = False,
    regions: Annotated[int, typer.Option("--regions", min=1, metavar="N", help="--whole-model: the hottest N extractable regions are optimised.")] = 3,
    force: Annotated[bool, typer.Option("--force", help="Let --out replace a run already in that folder (its kernel.py, trajectory.json and summary.json are deleted first).")] = False,
    max_autotune: MaxAutotuneOpt = False,
    modes: InductorModesOpt = None,
    timeout_scale: Annotated[Optional[float], TimeoutScaleOpt] = None,
    stage_timeout: Annotated[Optional[list[str]], StageTimeoutOpt] = None,
) -> None:
    """Turn a PyTorch reference module into a verified, faster Triton (or CUDA C++) kernel."""
    from kernelagent.agent.budget import Budget
    from kernelagent.agent.live import LiveView
    from kernelagent.models import make_model
    from kernelagent.orchestrate import default_out_dir
    from kernelagent.orchestrate import optimize as run_optimize
    from kernelagent.problem import load_problem

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
    from kernelagent.devices import check_device

    timeouts = stage_timeouts(timeout_scale, stage_timeout)
    try:
        # Bad input first, cheapest first, all before the slow parts (harness, model calls).
        compile_modes = inductor_modes(modes, max_autotune)
        loaded = load_problem(problem)
        if backend not in ("triton", "cuda"):
            raise UserError(f"--backend must be triton or cuda (got {backend!r})")
        device = check_device(device, quiet=True)
        from kernelagent.cli.core import click

        if not whole_model and ctx.get_parameter_source("regions") == click.core.ParameterSource.COMMANDLINE:
            raise UserError("--regions is for --whole-model (the hottest N regions of a whole model): add "
                            "--whole-model, or leave --regions out")
        if resume is not None:
            if out is not None and out.resolve() != resume.resolve():
                raise UserError("--resume DIR writes into DIR: leave out --out, or give the same folder")
            _check_resume(ctx, resume, loaded, whole_model, strategy=strategy, samples=samples, seed=seed,
                          regions=regions, mode=mode.value, trials=trials, target_speedup=target_speedup)
            from kernelagent.cli.resume_flags import FLAGS, recorded_flags, reuse

            given = dict(model=model, api_base=api_base, temperature=temperature, max_turns=max_turns,
                         max_tokens=max_tokens, max_cost=max_cost, timeout=timeout)
            typed = {k for k in FLAGS if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
            values, reused = reuse(given, recorded_flags(resume, whole_model), typed)
            model, api_base, temperature = values["model"], values["api_base"], values["temperature"]
            max_turns, max_tokens, max_cost, timeout = (values["max_turns"], values["max_tokens"], values["max_cost"],
                                                        values["timeout"])
            if reused and not quiet:
                typer.echo(terminal_text(reused), err=True)
        else:
            from kernelagent.orchestrate import check_strategy

            try:
                check_strategy(strategy, samples)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        out_dir = resume if resume is not None else (out if out is not None else default_out_dir(loaded.path))
        if resume is None:
            check_out(out_dir, force, explicit=out is not None, create=False)
        llm = make_model(model, api_base=api_base, api_key=api_key, timeout=model_timeout,
                         max_retries=max_retries, backoff_base=retry_backoff, temperature=temperature)
        llm.check_reachable()
        out = out_dir if resume is not None else check_out(out_dir, force, explicit=out is not None)
        check_device(device, quiet=quiet)  # again: auto says now that it runs on the CPU
    except UserError as exc:
        raise _fail(str(exc)) from None

    budget = Budget(max_turns=max_turns, max_tokens=max_tokens, max_cost=max_cost,
                    timeout=timeout)
    from kernelagent.cli.resume_flags import model_to_record

    # What a resume reuses (cli/resume_flags.py); never the key.
    model_info = {"spec": model_to_record(model), "api_base": api_base, "temperature": temperature}
    if whole_model:
        from kernelagent.cli.whole_model_cmd import run_whole_model

        raise typer.Exit(run_whole_model(problem=problem, llm=llm, budget=budget, out=out, device=device,
                                         trials=trials, strategy=strategy, samples=samples, mode=mode.value,
                                         target_speedup=target_speedup, regions=regions, live=live, quiet=quiet,
                                         resume=resume is not None, model_info=model_info))
    view = LiveView(budget, live=live, quiet=quiet)
    try:
        with view:
            run = run_optimize(
                problem, llm, mode=mode.value, budget=budget, target_speedup=target_speedup,
                out=out, device=device, trials=trials, quick_trials=min(quick_trials, trials),
                observer=view, model_info=model_info,
                backend=backend, strategy=strategy, samples=samples, model_concurrency=model_concurrency,
                seed=seed, resume=resume,
                eval_overrides={**({"compile_modes": compile_modes} if compile_modes != ("default",) else {}),
                                **({"timeouts": timeouts} if timeouts else {})} or None)
    except KeyboardInterrupt:
        summary = out / "summary.json"
        kernel = out / "kernel.py"
        kept = f"best kernel so far (not re-verified): {kernel}; " if kernel.is_file() else "no correct kernel yet; "
        saved = f"summary: {summary}" if summary.is_file() else f"trajectory: {out / 'trajectory.json'}"
        searched = resume is not None or strategy != "single"
        how = (f"; to go on: kernelagent optimize {problem} --resume {out}" if searched else
               "; a single conversation cannot be resumed (a --strategy search can, with --resume)")
        raise interrupted(f"interrupted: {kept}{saved}{how}") from None
    except UserError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:
        from kernelagent.harness import HarnessStartError

        if isinstance(exc, HarnessStartError):
            raise _fail(f"the evaluation harness could not start: {str(exc).splitlines()[0]}") from None
        raise

    summary = run.summary
    best = summary.get("best") or {}
    words = {"success": "correct kernel, meets the target",
             "short_of_target": "correct kernel, short of the target",
             "no_correct_kernel": "no correct kernel found",
             "model_unavailable": "the model did not answer, no kernel was judged"}[run.result.outcome]
    detail = f" ({summary['target_check']})" if best else ""
    if run.result.stop_reason == "model_error" and not best:  # the model's failure, in the same line
        detail = f" ({'the model stopped answering: ' if run.result.outcome != 'model_unavailable' else ''}" \
                 f"{run.result.stop_detail})"
    kernel = f"; kernel: {best['kernel']}" if best else ""
    typer.echo(terminal_text(f"{words}{detail}{kernel}; summary: {run.out_dir / 'summary.json'}"))
    raise typer.Exit(run.exit_code)


RUN_FILES = ("summary.json", "trajectory.json", "kernel.py")


def check_out(out: Path, force: bool, explicit: bool, create: bool = True) -> Path:
    """The output folder: a file there (or above it) or an earlier run in it is refused
    before anything starts. With `create`, the folder is made, and with --force the earlier
    run's files are deleted first."""
    for parent in [out, *out.parents]:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"--out {out}: {parent} is a file, not a folder")
    held = [name for name in RUN_FILES if (out / name).exists()]
    if held and explicit:
        if not force:
            raise UserError(f"--out {out} already holds a run ({', '.join(held)}): pass --force to replace it, "
                            "or choose another folder")
        if create:
            for name in held:
                (out / name).unlink()
    if not create:
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot create the folder: {exc.strerror or exc}") from None
    return out


def _check_resume(ctx: typer.Context, folder: Path, problem, whole_model: bool, **given) -> None:
    """--resume DIR: DIR holds a run of this kind for this problem, and the settings given on the
    command line are the run's (a different --strategy or --samples is refused, never ignored)."""
    from kernelagent.cli.core import click

    source = click.core.ParameterSource
    if whole_model:
        from kernelagent.orchestrate.whole_model import read_previous

        settings = read_previous(folder, problem)["settings"]
        recorded = {"strategy": settings.get("strategy"), "samples": settings.get("samples"),
                    "regions": settings.get("top"), "mode": settings.get("mode"), "trials": settings.get("trials"),
                    "target_speedup": settings.get("target_speedup")}
        what = f"a whole-model run ({recorded['strategy']}, --samples {recorded['samples']}, --regions " \
               f"{recorded['regions']})"
    else:
        from kernelagent.orchestrate import resumable

        try:
            summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            summary = None
        if isinstance(summary, dict) and summary.get("kind") == "whole_model":
            raise UserError(f"--resume {folder} is a whole-model run: add --whole-model")
        search = resumable(folder, problem)["search"]
        recorded = {"strategy": search.get("strategy"), "samples": search.get("samples"),
                    "seed": (search.get("settings") or {}).get("seed", 0)}
        what = f"a {recorded['strategy']} search with --samples {recorded['samples']}"
    for name, value in given.items():
        explicit = ctx.get_parameter_source(name) in (source.COMMANDLINE, source.ENVIRONMENT)
        if name in recorded and explicit and value != recorded[name]:
            raise UserError(f"--resume {folder} continues {what}: --{name.replace('_', '-')} {value} differs; "
                            "leave it out, or start a new run with --out")

"""`kernelagent eval PROBLEM CANDIDATE`: one verdict from the harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import finite
from kernelagent.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UserError


def eval_command(
    problem: Annotated[Path, typer.Argument(metavar="PROBLEM", help="Problem file (KernelBench format: Model, get_inputs, get_init_inputs).")],
    candidate: Annotated[Path, typer.Argument(metavar="CANDIDATE", help="Candidate file defining class ModelNew.")],
    trials: Annotated[int, typer.Option(min=1, max=100, metavar="N", help="Correctness trials, each with fresh seeded inputs.")] = 5,
    device: Annotated[str, typer.Option(metavar="DEVICE", help="auto, cpu, cuda or cuda:N. An explicit GPU must exist; only auto falls back to the CPU (and says so).")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one machine-readable JSON result.")] = False,
    timing: Annotated[bool, typer.Option(help="Time the candidate (and the baselines).")] = True,
    baselines: Annotated[bool, typer.Option(help="Time eager and torch.compile baselines (cached on disk).")] = True,
    max_autotune: Annotated[bool, typer.Option(help="Also time torch.compile mode max-autotune-no-cudagraphs.")] = False,
    profile: Annotated[bool, typer.Option(help="Report the candidate's top kernels (torch.profiler).")] = False,
    seed: Annotated[int, typer.Option(min=0, metavar="N", help="Seed of the first trial's inputs.")] = 42,
    atol: Annotated[Optional[float], typer.Option(metavar="X", callback=finite(0), help="Absolute tolerance, finite and >= 0 (default: by dtype).")] = None,
    rtol: Annotated[Optional[float], typer.Option(metavar="X", callback=finite(0), help="Relative tolerance, finite and >= 0 (default: by dtype).")] = None,
    isolation: Annotated[str, typer.Option(metavar="auto|bwrap|none", help="Sandbox of the harness: bubblewrap where it works (auto), always, or never.")] = "auto",
    cache_dir: Annotated[Optional[Path], typer.Option(metavar="DIR", help="Cache directory (default ~/.cache/kernelagent).")] = None,
    backend: Annotated[str, typer.Option(metavar="triton|cuda", help="Kernel language: Triton, or CUDA C++ built with torch.utils.cpp_extension.load_inline.")] = "triton",
) -> None:
    """Evaluate CANDIDATE against PROBLEM: compile, correctness, timing vs eager and torch.compile."""
    from kernelagent.cli import run_guarded

    code = run_guarded(_run, problem, candidate, trials, device, as_json, timing, baselines, max_autotune,
                       profile, seed, atol, rtol, isolation, cache_dir, backend)
    raise typer.Exit(code)


def _run(problem, candidate, trials, device, as_json, timing, baselines, max_autotune, profile, seed, atol, rtol,
         isolation, cache_dir, backend="triton") -> int:
    from kernelagent.harness import EvalConfig, Evaluator, Status
    from kernelagent.problem import load_problem, read_candidate

    if isolation not in ("auto", "bwrap", "none"):
        raise UserError(f"--isolation must be auto, bwrap or none (got {isolation!r})")
    if backend not in ("triton", "cuda"):
        raise UserError(f"--backend must be triton or cuda (got {backend!r})")
    loaded = load_problem(problem)
    source = read_candidate(candidate)
    config = EvalConfig(trials=trials, timing=timing, baselines=baselines, profile=profile, seed=seed, atol=atol,
                        rtol=rtol, backend=backend, compile_modes=("default", "max-autotune-no-cudagraphs") if max_autotune
                        else ("default",))
    try:
        with Evaluator(device=device, cache_dir=cache_dir, isolation=isolation) as evaluator:
            result = evaluator.evaluate(loaded, source, config)
    except ValueError as exc:  # a bad --device
        raise UserError(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=None, default=str))
    else:
        from kernelagent.cli.render import render_result

        render_result(result)
    if result.status == Status.BAD_PROBLEM:
        if not as_json:
            typer.echo(f"error: bad problem file {problem}", err=True)
        return EXIT_USAGE
    return EXIT_OK if result.passed else EXIT_FAILED

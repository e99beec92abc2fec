"""`kernelagent profile PROBLEM CANDIDATE`: why the candidate is as fast as it is.

Kernels (torch.profiler), a roofline fraction from the problem's bytes and FLOPs, and
Nsight Compute metrics for the top kernels where ncu and a GPU exist (see
kernelagent/harness/caller/profiling.py). Exit codes: 0 profiled (the candidate is correct), 1 the
candidate failed or was flagged, 2 bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import (DaemonOpt, InductorModesOpt, MaxAutotuneOpt, finite, folder, inductor_modes,
                                  warm_harness)
from kernelagent.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UserError
from kernelagent.text import terminal_text


def profile(
    problem: Annotated[Path, typer.Argument(metavar="PROBLEM", help="Problem file (KernelBench format).")],
    candidate: Annotated[Path, typer.Argument(metavar="CANDIDATE", help="Candidate file defining class ModelNew.")],
    backend: Annotated[str, typer.Option("--backend", metavar="triton|cuda", help="Kernel language: Triton, or CUDA C++ built with load_inline.")] = "triton",
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N. An explicit GPU must exist; only auto falls back to the CPU (and says so).")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ncu: Annotated[bool, typer.Option(help="Collect Nsight Compute metrics where ncu and a GPU exist.")] = True,
    ncu_timeout: Annotated[float, typer.Option("--ncu-timeout", min=10.0, metavar="SECONDS", callback=finite(10), help="Seconds for the ncu run.")] = 180.0,
    trials: Annotated[int, typer.Option("--trials", min=1, max=100, metavar="N", help="Correctness trials before profiling.")] = 2,
    baselines: Annotated[bool, typer.Option(help="Also time eager and torch.compile.")] = True,
    isolation: Annotated[str, typer.Option("--isolation", metavar="auto|bwrap|namespaces|none", help="Sandbox: auto (bubblewrap around the harness where it works, plus per-job namespaces where they work), bwrap (require bubblewrap), namespaces (require per-job namespaces), none (no sandbox; a warning says so).")] = "auto",
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", metavar="DIR", callback=folder, help="Cache directory (default ~/.cache/kernelagent).")] = None,
    max_autotune: MaxAutotuneOpt = False,
    modes: InductorModesOpt = None,
    daemon: DaemonOpt = None,
) -> None:
    """Profile CANDIDATE on PROBLEM: top kernels, roofline fraction, Nsight Compute metrics."""
    from kernelagent.cli import run_guarded

    code = run_guarded(_run, problem=problem, candidate=candidate, backend=backend, device=device, as_json=as_json,
                       ncu=ncu, ncu_timeout=ncu_timeout, trials=trials, baselines=baselines, isolation=isolation,
                       cache_dir=cache_dir, modes=modes, max_autotune=max_autotune, daemon=warm_harness(daemon))
    raise typer.Exit(code)


def _run(*, problem, candidate, backend, device, as_json, ncu, ncu_timeout, trials, baselines, isolation,
         cache_dir, modes=None, max_autotune=False, daemon=None) -> int:
    from kernelagent.devices import check_device
    from kernelagent.harness import Evaluator, Status
    from kernelagent.harness.caller import profiling
    from kernelagent.harness.cuda_source import BACKENDS
    from kernelagent.problem import load_problem, read_candidate

    compile_modes = inductor_modes(modes, max_autotune)
    if backend not in BACKENDS:
        raise UserError(f"--backend must be {' or '.join(BACKENDS)} (got {backend!r})")
    if isolation not in ("auto", "bwrap", "namespaces", "none"):
        raise UserError(f"--isolation must be auto, bwrap, namespaces or none (got {isolation!r})")
    loaded = load_problem(problem)
    source = read_candidate(candidate)
    device = check_device(device)  # a GPU that is not there: exit 2 before anything starts
    try:
        with Evaluator(device=device, cache_dir=cache_dir, isolation=isolation, daemon=daemon) as evaluator:
            report = profiling.profile(loaded, source, evaluator=evaluator, backend=backend, trials=trials,
                                       use_ncu=ncu, ncu_timeout=ncu_timeout, baselines=baselines,
                                       config_overrides={"compile_modes": tuple(compile_modes)})
    except ValueError as exc:  # a bad --device
        raise UserError(str(exc)) from None
    result = report["result"]
    if result.status == Status.BAD_PROBLEM and not as_json:
        from kernelagent.cli.eval_cmd import one_line

        raise UserError(f"bad problem file {problem}: {one_line(result.reason) or 'it failed in the harness'}")
    if as_json:
        typer.echo(json.dumps({"status": result.status, "reason": result.reason, "passed": result.passed,
                               "device": result.device, "backend": backend, "lines": report["lines"],
                               "kernels": result.kernels, "roofline": report["roofline"], "ncu": report["ncu"],
                               "timings": {k: v.__dict__ for k, v in result.timings.items()},
                               "speedups": result.speedups, "speedup_intervals": result.speedup_intervals,
                               "clocks": report["clocks"], "numerics": result.numerics,
                               "workload": result.workload,
                               "flags": [f.__dict__ for f in result.flags]}, default=str))
    else:
        # The reason, the kernels' names and the flags' messages are the candidate's text.
        typer.echo(terminal_text(f"{problem.name} / {candidate.name} [{backend}] on {result.device or '?'}: "
                                 f"{result.status}"
                                 + (" (flagged)" if result.status == Status.CORRECT and not result.passed else "")))
        if result.reason:
            typer.echo(terminal_text(result.reason))
        for line in report["lines"]:
            typer.echo(terminal_text(line))
        for flag in result.flags:
            if flag.severity in ("reject", "review"):
                typer.echo(terminal_text(f"{flag.severity}: [{flag.kind}] {flag.message}"))
    if result.status == Status.BAD_PROBLEM:
        return EXIT_USAGE
    if result.status == Status.TOO_LARGE:
        from kernelagent.errors import EXIT_TOO_LARGE

        return EXIT_TOO_LARGE
    return EXIT_OK if result.passed else EXIT_FAILED

"""`kernelagent eval PROBLEM CANDIDATE [CANDIDATE ...]`: a verdict from the harness per candidate,
one harness started for them all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from kernelagent.cli.core import (DaemonOpt, InductorModesOpt, MaxAutotuneOpt, StageTimeoutOpt, TimeoutScaleOpt, finite, folder,
                                  inductor_modes, interrupted, stage_timeouts, warm_harness)
from kernelagent.errors import EXIT_FAILED, EXIT_OK, EXIT_TOO_LARGE, UserError
from kernelagent.text import terminal_text


def eval_command(
    problem: Annotated[Path, typer.Argument(metavar="PROBLEM", help="Problem file (KernelBench format: Model, get_inputs, get_init_inputs).")],
    candidates: Annotated[list[Path], typer.Argument(metavar="CANDIDATE...", help="Candidate file defining class ModelNew; several are judged one after another by one harness (its start is paid once), each printed as it is judged.", show_default=False)],
    trials: Annotated[int, typer.Option("--trials", min=1, max=100, metavar="N", help="Correctness trials, each with fresh seeded inputs.")] = 5,
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N. An explicit GPU must exist; only auto falls back to the CPU (and says so).")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one machine-readable JSON result per candidate, one per line (JSON Lines).")] = False,
    timing: Annotated[bool, typer.Option(help="Time the candidate (and the baselines).")] = True,
    baselines: Annotated[bool, typer.Option(help="Time eager and torch.compile baselines (cached on disk).")] = True,
    max_autotune: MaxAutotuneOpt = False,
    modes: InductorModesOpt = None,
    profile: Annotated[bool, typer.Option(help="Report the candidate's top kernels (torch.profiler).")] = False,
    kernel_evidence: Annotated[bool, typer.Option("--kernel-evidence/--no-kernel-evidence", help="On a GPU, check which kernels did the work of every correct result: a CUPTI trace of the candidate's own checked and timed calls (see --evidence), judged by the harness against the candidate's source and timing. Where no evidence can be had the result is flagged for review. On by default; nothing on the CPU.")] = True,
    evidence: Annotated[str, typer.Option("--evidence", metavar="trace|ncu", help="Where the kernel evidence comes from: trace (the default: the trace of the timed calls themselves; Nsight Compute, jailed, audits every result that beats Inductor and a seeded 10% of the rest, and stands in where the trace cannot load) or ncu (Nsight Compute runs the candidate again for every correct result).")] = "trace",
    audit: Annotated[str, typer.Option("--audit", metavar="share|wins|always", help="Which results Nsight Compute audits besides the trace, a second run of the candidate, jailed (a few seconds more on a GPU): share (the default: a seeded 10% of results, drawn in secret, as in a batch), wins (every result that beats Inductor, as verify, regenerate and bench's counted wins are) or always.")] = "share",
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, metavar="N", help="Fix the master seed of the checks' inputs and derived shapes (to debug, or to reproduce a result: its seeds.base). By default every evaluation draws a secret one, reported in the result afterwards.", show_default=False)] = None,
    atol: Annotated[Optional[float], typer.Option("--atol", metavar="X", callback=finite(0), help="Absolute tolerance, finite and >= 0 (default: by dtype).")] = None,
    rtol: Annotated[Optional[float], typer.Option("--rtol", metavar="X", callback=finite(0), help="Relative tolerance, finite and >= 0 (default: by dtype).")] = None,
    isolation: Annotated[str, typer.Option("--isolation", metavar="auto|bwrap|namespaces|none", help="Sandbox: auto (bubblewrap around the harness where it works, plus per-job namespaces where they work), bwrap (require bubblewrap), namespaces (require per-job namespaces), none (no sandbox; a warning says so).")] = "auto",
    cache_dir: Annotated[Optional[Path], typer.Option("--cache-dir", metavar="DIR", callback=folder, help="Cache directory (default ~/.cache/kernelagent).")] = None,
    backend: Annotated[str, typer.Option("--backend", metavar="triton|cuda", help="Kernel language: Triton, or CUDA C++ built with torch.utils.cpp_extension.load_inline.")] = "triton",
    timeout_scale: Annotated[Optional[float], TimeoutScaleOpt] = None,
    stage_timeout: Annotated[Optional[list[str]], StageTimeoutOpt] = None,
    compile_on_cpu: Annotated[bool, typer.Option("--compile-baseline-on-cpu", help="On the CPU, time the torch.compile baseline too (skipped there by default: Inductor's CPU build is slow and the interpreter's timings mean nothing).")] = False,
    whole_model: Annotated[bool, typer.Option("--whole-model", help="Judge CANDIDATE as a whole model spliced by `optimize --whole-model` (its OUT/model_optimized.py) against PROBLEM, the original model, with the rules of that run's end-to-end check: PyTorch may run the regions that were not replaced (reported as torch-work, not rejected), the static pass reports, no Nsight Compute evidence. The spliced kernels count as the candidate's own.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print the harness's seconds per stage.")] = False,
    daemon: DaemonOpt = None,
) -> None:
    """Evaluate CANDIDATE against PROBLEM: compile, correctness, timing vs eager and torch.compile."""
    from kernelagent.cli import run_guarded

    code = run_guarded(_run, problem=problem, candidates=candidates, trials=trials, device=device, as_json=as_json,
                       timing=timing, baselines=baselines, max_autotune=max_autotune, profile=profile, seed=seed,
                       atol=atol, rtol=rtol, isolation=isolation, cache_dir=cache_dir, backend=backend, modes=modes,
                       kernel_evidence=kernel_evidence, timeouts=stage_timeouts(timeout_scale, stage_timeout),
                       daemon=warm_harness(daemon), whole_model=whole_model, compile_on_cpu=compile_on_cpu, evidence=evidence,
                       audit=audit, verbose=verbose)
    raise typer.Exit(code)


def _run(*, problem, candidates, trials, device, as_json, timing, baselines, max_autotune, profile, seed, atol, rtol,
         isolation, cache_dir, backend="triton", modes=None, kernel_evidence=True, timeouts=None, daemon=None,
         whole_model=False, compile_on_cpu=False, evidence: str = "trace", audit: str = "share",
         verbose: bool = False) -> int:
    from kernelagent.devices import check_device
    from kernelagent.interrupt import stop_now
    from kernelagent.harness import EvalConfig, Evaluator
    from kernelagent.problem import load_problem, read_candidate

    if isolation not in ("auto", "bwrap", "namespaces", "none"):
        raise UserError(f"--isolation must be auto, bwrap, namespaces or none (got {isolation!r})")
    if backend not in ("triton", "cuda"):
        raise UserError(f"--backend must be triton or cuda (got {backend!r})")
    if audit not in ("share", "wins", "always"):
        raise UserError(f"--audit must be share, wins or always (got {audit!r})")
    compile_modes = inductor_modes(modes, max_autotune)  # an unknown mode: exit 2 before any file is read
    loaded = load_problem(problem)
    sources = [read_candidate(candidate) for candidate in candidates]  # every file read before any start
    settings = dict(trials=trials, timing=timing, baselines=baselines, profile=profile, seed=seed, atol=atol,
                    rtol=rtol, backend=backend, **({"timeouts": timeouts} if timeouts else {}),
                    compile_modes=compile_modes, kernel_evidence=kernel_evidence, evidence=evidence,
                    # a plain eval is audited on the seeded share, as a batch is (issue 55's design audits
                    # the wins that are kept: optimize's final kernel, bench's counted wins, verify's and
                    # regenerate's locks); --audit wins or always asks for more
                    audit_wins=audit == "wins", audit=audit == "always",
                    **({"compile_baseline_on_cpu": True} if compile_on_cpu else {}))
    try:
        if whole_model:  # the rules of optimize --whole-model's end-to-end check (wholemodel/e2e.py)
            from kernelagent.wholemodel.e2e import e2e_config

            config = e2e_config(**settings)
        else:
            config = EvalConfig(**settings)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    device = check_device(device, quiet=True)  # a GPU that is not there: exit 2 before anything starts
    try:
        evaluator = Evaluator(device=device, cache_dir=cache_dir, isolation=isolation, daemon=daemon)
    except ValueError as exc:  # a bad --device
        raise UserError(str(exc)) from None
    code = EXIT_OK
    try:
        for judged, (candidate, source) in enumerate(zip(candidates, sources)):
            try:
                result = evaluator.evaluate(loaded, source, config)
            except KeyboardInterrupt:
                stop_now(evaluator)
                done = f" ({judged} of {len(candidates)} judged and printed)" if len(candidates) > 1 else ""
                raise interrupted(f"interrupted: the evaluation was stopped before a verdict{done}") from None
            _report(result=result, problem=problem, candidate=candidate, source=source, as_json=as_json,
                    whole_model=whole_model, device=device, heading=len(candidates) > 1, first=judged == 0,
                    verbose=verbose)
            if not result.passed:
                code = EXIT_FAILED
    finally:
        evaluator.close()
    return code


def _report(*, result, problem: Path, candidate: Path, source: str, as_json: bool, whole_model: bool, device: str,
            heading: bool, first: bool, verbose: bool = False) -> None:
    """Print one candidate's verdict (a JSON line under --json); a problem's or a machine's
    fault (no verdict about the candidate) is one line on stderr and its exit code."""
    from kernelagent.devices import check_device
    from kernelagent.harness import Status

    if result.isolation.get("warning") and first:  # the same harness judges every candidate
        typer.echo(terminal_text(f"warning: {result.isolation['warning']}"), err=True)
    if result.status == Status.BAD_PROBLEM:
        # The problem's fault, not the candidate's: what went wrong goes to stderr (in full
        # under --json), nothing to stdout that looks like a verdict.
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=None, default=str))
        raise UserError(f"bad problem file {problem}: {one_line(result.reason) or 'it failed in the harness'}")
    if result.status == Status.TOO_LARGE:
        # About this machine, not the candidate: no verdict on stdout (the JSON under --json).
        if as_json:
            typer.echo(json.dumps(result.to_dict(), indent=None, default=str))
        raise UserError(f"{problem}: {result.reason.splitlines()[0][:600]}", exit_code=EXIT_TOO_LARGE)
    check_device(device)  # auto without a GPU: the note, beside the verdict (never before an error line)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=None, default=str))
        return
    from kernelagent.cli.render import render_result

    if heading:
        typer.echo(terminal_text(f"== {candidate} =="))
    render_result(result, stages=verbose)
    if not result.passed and not whole_model:
        from kernelagent.wholemodel.e2e import is_spliced

        if is_spliced(source):
            typer.echo(terminal_text(
                f"note: {candidate.name} is a whole model spliced by `optimize --whole-model`: PyTorch runs "
                "the regions it did not replace, which this check rejects; judge it as the run did with "
                f"`kernelagent eval {problem} {candidate} --whole-model`"), err=True)


def one_line(text: str, limit: int = 300) -> str:
    """The last non-empty line of a reason (an exception's own message sits there), cut."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[:limit] + "..."

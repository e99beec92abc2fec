"""`kernelagent dataset prompts DIR --out prompts.jsonl [--split 0.8 --seed 0]`.

Progress goes to stderr (a live line on a terminal, a line every few problems otherwise),
so a long inspection (a KernelBench checkout: minutes on a first run, seconds from the
cache after) is never silent."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from kernelagent.cli.core import Command, finite, typer_app
from kernelagent.text import plural

dataset_app = typer_app(help="Datasets for training kernel models.", no_args_is_help=True)


class Mode(str, Enum):
    text = "text"
    tools = "tools"
    auto = "auto"


@dataset_app.command("prompts", cls=Command)
def prompts(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A benchmark folder (levelN/ folders, one levelN folder, a flat folder or a KernelBench checkout; found as `bench` finds them), or one problem file.")],
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="JSONL file to write (one row per problem).")] = Path("prompts.jsonl"),
    split: Annotated[float, typer.Option("--split", min=0.0, max=1.0, metavar="X", callback=finite(0, 1), help="Train fraction; each problem's side is fixed by a hash of (seed, the problem's content). Also writes <stem>.train.jsonl and <stem>.test.jsonl. `export sft` uses the same rule.")] = 0.8,
    seed: Annotated[int, typer.Option("--seed", min=0, metavar="N", help="Seed of the split.")] = 0,
    mode: Annotated[Mode, typer.Option("--mode", help="Prompt variant: text (one code block per answer), tools or auto, as in optimize.")] = Mode.text,
    gpu: Annotated[str, typer.Option("--gpu", metavar="NAME", help="Device named in the prompt: a GPU name (e.g. 'NVIDIA H200'), 'cpu', or 'auto' (this machine's first visible GPU, else the CPU). Name the device the rewards are timed on.")] = "auto",
    target_speedup: Annotated[float, typer.Option("--target-speedup", min=0.0, metavar="X", callback=finite(0), help="Target named in the prompt.")] = 1.0,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, metavar="N", help="Turn budget named in the prompt (the environments' default is 10; use 1 for single-turn GRPO).")] = 10,
    inputs: Annotated[bool, typer.Option("--inputs/--no-inputs", help="Describe input shapes and dtypes in the prompt (inspects each problem in a child process).")] = True,
) -> None:
    """Write one chat prompt per problem (TRL's conversational prompt format), with the
    problem id and source as columns for the reward function."""
    from kernelagent.cli import run_guarded

    run_guarded(_prompts, directory=directory, out=out, split=split, seed=seed, mode=mode.value, gpu=gpu,
                target_speedup=target_speedup, max_turns=max_turns, inputs=inputs)


def _prompts(*, directory, out, split, seed, mode, gpu, target_speedup, max_turns, inputs) -> None:
    import sys
    import time

    from kernelagent.errors import UserError
    from kernelagent.rl.dataset import write_prompts

    if not directory.exists():
        raise UserError(f"not found: {directory}")
    tty = sys.stderr.isatty()
    state = {"cached": 0, "last": 0.0}

    def progress(done: int, total: int, problem, cached: bool) -> None:
        state["cached"] += cached
        now = time.monotonic()
        if done < total and now - state["last"] < (0.2 if tty else 10.0):
            return
        state["last"] = now
        line = (f"inspecting inputs: {done}/{total} ({state['cached']} cached) {problem.display}")
        sys.stderr.write(("\r" + line[:110].ljust(110)) if tty else line + "\n")
        if tty and done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    try:
        info = write_prompts(directory, out, split=split, seed=seed, mode=mode, gpu=gpu,
                             target_speedup=target_speedup, max_turns=max_turns,
                             inspect_inputs=inputs, progress=progress)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    detail = f" (train {info['train']}, test {info['test']}, seed {seed})"
    typer.echo(f"{info['rows']} prompts{detail}: {', '.join(info['files'])}")


@dataset_app.command("nodes", cls=Command)
def nodes(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN...", help="Search run folders (optimize --strategy best-of-n, beam or evolve), or folders holding them.")],
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="JSONL file: one row per node (prompt, completion, reward, its place in the tree).")] = Path("nodes.jsonl"),
) -> None:
    """Every node of search runs as a prompt/completion row with its reward: the per-node records
    the RL reward and the trees share (for reward models, sibling preference pairs, offline RL)."""
    from kernelagent.cli import run_guarded

    run_guarded(_nodes, runs, out)


def _nodes(runs, out) -> None:
    import json

    from kernelagent.errors import UserError
    from kernelagent.files import check_output_file, write_text
    from kernelagent.rl.dataset import node_rows

    missing = [str(r) for r in runs if not r.exists()]
    if missing:
        raise UserError(f"not found: {', '.join(missing)}")
    check_output_file(out)
    rows, read = node_rows(runs)
    if not read:
        raise UserError("no search runs found (trajectory.json with a \"search\" tree): run optimize with "
                        "--strategy best-of-n, beam or evolve")
    write_text(out, "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows))
    typer.echo(f"{plural(len(rows), 'node')} from {plural(read, 'search run')}: {out}")

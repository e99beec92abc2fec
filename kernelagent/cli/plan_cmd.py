"""`kernelagent plan MODEL.py`: profile a whole model and rank its regions (kernelagent/wholemodel).

Exit codes: 0 the plan is written, 2 bad input (a missing file, not a problem, a model that
raises or that torch.export cannot capture, --out on a file, a GPU that does not exist): one
line on stderr that names the file. A warning line on stderr for each doubt the plan's own numbers
raise: on the CPU, ops that sum past the forward they ran in (measured again, then flagged) and a
forward whose time moved between the plan's rounds (plan.json totals.unsteady); on a GPU, ops
that disagree with the model's own forward."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def plan(
    problem: Annotated[Path, typer.Argument(metavar="MODEL", help="A model in the KernelBench format (class Model, get_inputs, get_init_inputs).", show_default=False)],
    out: Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="Where plan.json and the extracted region problems (regions/region_N.py) go (default: plans/<model>): a new or empty folder, or an earlier plan's (planned again).", show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N. On the CPU the model runs at smoke sizes and times are CPU times.")] = "auto",
    top: Annotated[int, typer.Option("--top", min=1, metavar="N", help="Regions shown in the table (plan.json has all).")] = 12,
    json_out: Annotated[bool, typer.Option("--json", help="Print plan.json's regions as one JSON object instead of the table.")] = False,
) -> None:
    """Profile a model's forward on its get_inputs(), group its ops into regions, rank them by device time (with Amdahl's bound) and write each extractable region as a standalone problem."""
    from kernelagent.cli import run_guarded

    run_guarded(_plan, problem=problem, out=out, device=device, top=top, json_out=json_out)


def _plan(*, problem: Path, out: Path | None, device: str, top: int, json_out: bool) -> None:
    import json

    from kernelagent.devices import check_device, gpu_indices
    from kernelagent.errors import UserError
    from kernelagent.problem import load_problem
    from kernelagent.text import terminal_text
    from kernelagent.wholemodel.plan import make_plan, render, warnings

    device = check_device(device, quiet=True)
    load_problem(problem)  # a file that is not a problem: one line, before any note
    out = out or Path("plans") / problem.stem
    for folder in [out, *out.parents]:
        if folder.exists() and not folder.is_dir():
            raise UserError(f"--out {out}: {folder} is a file, not a folder")
    # A plan's own folder (plan.json, regions/) is planned again; any other file there is the
    # user's, and a plan is not written among them.
    others = sorted(p.name for p in out.iterdir() if p.name not in ("plan.json", "regions")) if out.is_dir() else []
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise UserError(f"--out {out} is not empty and holds no plan ({shown}): give an empty or new folder, "
                        "or an earlier plan's")
    if device == "auto":  # the table's clock line says when it is the CPU's
        device = "cuda" if gpu_indices() else "cpu"
    data = make_plan(problem, out, device=device)
    for said in warnings(data):
        typer.echo(terminal_text(f"warning: {said}"), err=True)
    if json_out:
        typer.echo(json.dumps({"plan": str(out / "plan.json"), "totals": data["totals"],
                               "regions": data["regions"]}, default=str))
        return
    typer.echo(render(data, top))
    typer.echo(f"plan: {out / 'plan.json'}; region problems: {out / 'regions'}")

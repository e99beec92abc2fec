"""`kernelagent plan model.py`: where a whole model's time goes, region by region.

The model runs in a child process (child.py), never in the caller: it is the user's code, and
it imports torch. This side starts it, reads plan.json, and renders the table.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from kernelagent.errors import UserError

PLAN_TIMEOUT_S = 900.0


class PlanError(UserError):
    """The model could not be planned (export failed, the file is not a problem): one line, exit 2."""


def _child(args: list[str], timeout: float) -> str:
    from kernelagent.harness import interpreter

    try:
        # Isolated: the user's folder is not on the child's path (interpreter.py).
        proc = subprocess.run(interpreter.module_argv("kernelagent.wholemodel.child", *args), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PlanError(f"the model did not finish capturing within {timeout:.0f} s") from None
    for line in proc.stdout.splitlines():
        if line.startswith("KERNELAGENT_ERROR "):
            raise PlanError(line.split(" ", 1)[1])
        if line.startswith("error: "):
            raise PlanError(line[len("error: "):])
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["no output"]
        raise PlanError(f"capturing the model failed: {tail[0][:300]}")
    return proc.stdout


def make_plan(problem: str | Path, out: str | Path, device: str = "cpu", timeout: float = PLAN_TIMEOUT_S) -> dict:
    """Profile the model, group its regions, extract them; returns plan.json's content."""
    from kernelagent.problem import load_problem

    loaded = load_problem(problem)  # missing file, no Model/get_inputs, syntax error: ProblemError
    out = Path(out)
    for folder in [out, *out.parents]:
        if folder.exists() and not folder.is_dir():
            raise PlanError(f"{out}: {folder} is a file, not a folder (the plan needs a folder)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(f"{out}: cannot create the folder: {exc.strerror or exc}") from None
    try:
        _child(["plan", str(loaded.path), "--device", device, "--out", str(out)], timeout)
    except PlanError as exc:  # the file is named once, whichever step failed
        text = str(exc)
        raise PlanError(text if str(loaded.path) in text or str(problem) in text else f"{loaded.path}: {text}") from None
    return json.loads((out / "plan.json").read_text(encoding="utf-8"))


def splice(problem: str | Path, plan_path: str | Path, kernels: dict[str, str | Path], out: str | Path,
           device: str = "cpu", timeout: float = PLAN_TIMEOUT_S) -> Path:
    """Write the model with `kernels` ({region id: kernel file}) in place of their regions."""
    failed = splice_many(problem, plan_path, [(kernels, out)], device, timeout)
    if failed:
        raise PlanError(next(iter(failed.values())))
    return Path(out)


def splice_many(problem: str | Path, plan_path: str | Path, jobs: list[tuple[dict[str, str | Path], str | Path]],
                device: str = "cpu", timeout: float = PLAN_TIMEOUT_S) -> dict[str, str]:
    """Several spliced models from one child (one capture of the model): each job is ({region id:
    kernel file}, output file). Returns {output file: why} for the jobs that could not be written."""
    import tempfile

    spec = [{"out": str(out), "kernels": {rid: str(path) for rid, path in kernels.items()}} for kernels, out in jobs]
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="kernelagent-splice-", delete=False) as handle:
        json.dump(spec, handle)
    try:
        stdout = _child(["splice", str(problem), "--plan", str(plan_path), "--device", device, "--jobs", handle.name],
                        timeout)
    finally:
        Path(handle.name).unlink(missing_ok=True)
    for line in stdout.splitlines():
        if line.startswith("KERNELAGENT_SPLICED "):
            return dict(json.loads(line.split(" ", 1)[1]).get("failed") or {})
    raise PlanError("splicing the model gave no answer")


def table_rows(plan: dict, top: int | None = None) -> list[dict[str, Any]]:
    rows = []
    for region in plan["regions"][: top or None]:
        rows.append({"region": region["id"], "kind": region["kind"], "ops": ", ".join(dict.fromkeys(region["ops"])), "share": region["share"],
            "time_us": region["time_us"], "amdahl": region["amdahl_bound"], "shape": region.get("shape"),
            "dtype": region.get("dtype"), "fusable": region["fusable"],
            "extract": "yes" if region["extractable"] else f"no: {region['why_not']}"})
    return rows


def _bound(amdahl: float | None) -> str:
    """Amdahl's bound as the table shows it: None is a region holding the whole forward, where
    the bound is unbounded (plan.json's null), never 0.00x."""
    return "unbound" if amdahl is None else f"{amdahl:6.2f}x"


def render(plan: dict, top: int | None = 12) -> str:
    """The plan as a plain-text table (rich renders the same rows in the CLI)."""
    totals = plan["totals"]
    lines = [f"{'region':10} {'kind':16} {'share':>7} {'us':>10} {'amdahl':>7}  {'shape':22} {'dtype':9} "
             f"{'fusable':7} extract  ops"]
    for r in table_rows(plan, top):
        lines.append(f"{r['region']:10} {r['kind'][:16]:16} {r['share']:7.1%} {r['time_us']:10.1f} "
                     f"{_bound(r['amdahl']):>7}  {str(tuple(r['shape'] or ()))[:22]:22} {str(r['dtype'])[:9]:9} "
                     f"{'yes' if r['fusable'] else 'no':7} {r['extract'][:60]}  {r['ops'][:60]}")
    lines.append(clock_line(totals))
    return "\n".join(lines)


def clock_line(totals: dict) -> str:
    """What the times are: on the CPU (rounds, plan.json totals.noise) the ops' share of the forward
    they ran in, with the noise; on a GPU (and in an earlier plan) against the model's own forward."""
    noise = totals.get("noise")
    if isinstance(noise, dict) and totals.get("graph_forward_us"):
        flag = "" if totals.get("consistent", True) else " (flagged: past the tolerance)"
        return (f"clock: {totals['clock']}; the ops sum to {totals['nodes_us']:.1f} us, "
                f"{totals['nodes_vs_forward']:.1%} of the captured graph's forward ({totals['graph_forward_us']:.1f} us, "
                f"run op by op){flag}; the model's own forward {totals['model_forward_us']:.1f} us; medians of "
                f"{noise['rounds']} interleaved rounds; noise: the middle half of the forwards spans "
                f"{noise['forward_spread']:.0%} of their median, shares within {noise.get('share_error', 0):.1%}")
    ratio = totals.get("nodes_vs_model")
    return (f"clock: {totals['clock']}; the regions sum to {totals['nodes_us']:.1f} us per forward, "
            f"the model's own forward {totals['model_forward_us']:.1f} us under torch.profiler"
            + (f" ({ratio:.1%})" if ratio else ""))


def warnings(plan: dict) -> list[str]:
    """What the plan's own numbers say about trusting it, one line each: on the CPU, a measurement
    whose ops sum past their forward and a forward that moved between the rounds (timing.warnings);
    on a GPU, the ops against the model's own forward (child.agreement_warning). A plan written
    before those checks: judged here from its totals."""
    totals = plan.get("totals") or {}
    if "warning" in totals:
        return [line for line in str(totals["warning"] or "").splitlines() if line]
    from kernelagent.wholemodel.child import agreement_warning

    said = agreement_warning(totals, cuda=str(plan.get("device", "cpu")).startswith("cuda"))
    return [said] if said else []


def warning(plan: dict) -> str | None:
    """warnings(), the first (the gravest), or None."""
    return next(iter(warnings(plan)), None)

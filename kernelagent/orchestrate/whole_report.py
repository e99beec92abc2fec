"""A whole model's report.html: the bench report's look (kernelagent/html_page.py), the plan's
percentages, and links to each region's own run (its kernel, summary and trajectory), its
problem, the spliced model and the plan. Links are relative: the folder can be moved or copied.

A region's `why` and the verdict quote what the harness said of the spliced model (a candidate's
reason) and file names: every string goes through kernelagent.text.html_text."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kernelagent.html_page import cards, cell, page
from kernelagent.text import html_text as escape

OK = ("spliced", "kernel found")
BAD = ("left out", "no kernel", "interrupted", "model unavailable")


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * float(v):.1f}%"


def _x(v: Any, interval: Any = None) -> str:
    if v is None:
        return "–"
    bounds = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval and len(interval) == 2 else ""
    return f"{float(v):.3f}x{bounds}"


def _link(out: Path, target: Any, text: str) -> str:
    """A relative link to `target` if it is a file in the run folder, else the text alone."""
    if not target:
        return escape(text)
    path = Path(target)
    path = path if path.is_absolute() else out / path
    if not path.exists():
        return escape(text)
    try:
        href = os.path.relpath(path, out)
    except ValueError:
        return escape(text)
    return f'<a href="{escape(Path(href).as_posix())}">{escape(text)}</a>'


def _links(out: Path, row: dict[str, Any]) -> str:
    run = out / row["run"] if row.get("run") else None
    parts = []
    if row.get("problem"):
        parts.append(_link(out, row["problem"], "problem"))
    if run is not None:
        for name in ("kernel.py", "summary.json", "trajectory.json"):
            if (run / name).exists():
                parts.append(_link(out, run / name, name.split(".")[0] if name != "kernel.py" else "kernel"))
    splice = out / "splices" / f"{row['region']}.py"
    if splice.exists():
        parts.append(_link(out, splice, "spliced alone"))
    return " · ".join(parts) or "–"


def _row(out: Path, r: dict[str, Any]) -> str:
    cls = "ok" if r["status"] in OK else "bad" if r["status"] in BAD else ""
    share = float(r.get("share") or 0.0)
    cells = [
        f'<td data-v="{escape(r["region"])}">{_link(out, r.get("run") and Path(r["run"]) / "summary.json", r["region"])}'
        "</td>",
        cell(r.get("kind") or ""), cell(r.get("ops") or ""),
        cell(_pct(share), share, "num"), cell(_x(r.get("amdahl_bound")), r.get("amdahl_bound") or 0, "num"),
        cell(r["status"], cls="st"), cell(str(r.get("turns", "–")), r.get("turns") or 0, "num"),
        cell(_x(r.get("kernel_speedup"), r.get("kernel_interval")), r.get("kernel_speedup") or -1, "num"),
        cell(_x(r.get("e2e_alone_speedup"), r.get("e2e_alone_interval")), r.get("e2e_alone_speedup") or -1, "num"),
        cell(_pct(r.get("contribution")), r.get("contribution") or -1, "num"),
        cell(r.get("why") or ""), f"<td>{_links(out, r)}</td>"]
    return f'<tr class="{cls}">' + "".join(cells) + "</tr>"


def render_html(summary: dict[str, Any], out: str | Path | None = None) -> str:
    """report.html of a whole-model run (`out`: its folder, where the links point; by default the
    folder of its summary's plan)."""
    out = Path(out) if out is not None else Path(summary["plan"]).parent.parent if summary.get("plan") else Path(".")
    rows = summary.get("regions") or []
    interval = summary.get("e2e_interval")
    name = Path(summary["problem"]).name
    outcome = summary.get("outcome", "finished")
    verdict = summary.get("verdict") or ("interrupted" if outcome == "interrupted" else "running")
    spent = summary.get("budget") or {}
    chosen = [r for r in rows if r.get("chosen")]
    found = [r for r in rows if r.get("agent") == "kernel" or r["status"] == "spliced"]
    items = [("end to end", verdict),
             ("speedup vs " + (summary.get("e2e_baseline") or "eager"),
              _x(summary.get("e2e_speedup"), interval) if summary.get("e2e_speedup") is not None else "–"),
             ("vs torch.compile of the model", _x(summary.get("e2e_vs_compile"))),
             ("regions spliced", f"{len(summary.get('spliced') or [])} of {len(chosen)}"),
             ("kernels found", str(len(found))),
             ("share of time replaced", _pct(sum(float(r["share"]) for r in rows if r["status"] == "spliced"))),
             ("model calls", f"{spent.get('turns', 0)}" + (f" / {spent['max_turns']}" if spent.get("max_turns")
                                                            else "")),
             ("tokens", f"{int(spent.get('tokens') or 0):,}"), ("cost", f"${float(spent.get('cost_usd') or 0):.4f}"),
             ("wall", f"{float(summary.get('wall_time_s') or 0):.1f} s")]
    notes = ""
    if outcome == "interrupted":
        notes += ('<p class="note">The run was interrupted (Ctrl-C). Every finished region is kept; continue with '
                  f'<code>kernelagent optimize {escape(name)} --whole-model --resume {escape(str(out))}</code>.</p>')
    elif outcome == "running":
        notes += '<p class="note">The run is still going: this page is rewritten as each region ends.</p>'
    if summary.get("verdict") and not summary.get("timings_meaningful"):
        notes += ('<p class="note">Timings were taken on the CPU under the Triton interpreter: they are not '
                  'meaningful, so no end-to-end speedup is reported. The plan\'s shares are CPU times.</p>')
    totals = summary.get("plan_totals") or {}
    if totals.get("warning"):
        notes += f'<p class="note">{escape(totals["warning"])}</p>'
    settings = summary.get("settings") or {}
    meta = (f"model {summary.get('model')} · strategy {settings.get('strategy', 'single')}"
            + (f" ×{settings.get('samples')}" if settings.get("strategy", "single") != "single" else "")
            + f" · the hottest {settings.get('top', '?')} regions · device {summary.get('device')}"
            + f" · {summary.get('sessions', 1)} session(s)")
    files = " · ".join(part for part in (
        _link(out, summary.get("model_optimized"), "model_optimized.py") if summary.get("model_optimized") else "",
        _link(out, summary.get("plan"), "plan.json") if summary.get("plan") else "",
        _link(out, out / "summary.json", "summary.json")) if part)
    check = ""
    if summary.get("model_optimized"):
        check = (f'<p class="meta">Judge the spliced model again with the run\'s rules: <code>kernelagent eval '
                 f'{escape(str(summary["problem"]))} {escape(str(summary["model_optimized"]))} --whole-model</code></p>')
    reason = (f'<p class="meta">{escape(str(summary["reason"]).splitlines()[0][:300])}</p>'
              if summary.get("reason") and not summary.get("passed") else "")
    head = "".join(f"<th>{h}</th>" for h in ("region", "kind", "ops", "share", "Amdahl bound", "status", "model calls",
                                             "kernel speedup", "alone, end to end", "contribution", "why", "files"))
    table = (f'<table class="sortable" id="regions"><thead><tr>{head}</tr></thead>'
             f'<tbody>{"".join(_row(out, r) for r in rows)}</tbody></table>')
    body = (f"<h1>kernelagent whole model: {escape(name)}</h1><p class=\"meta\">{escape(meta)}</p>"
            f'<p class="meta">{files}</p>{check}{notes}{reason}{cards(items)}'
            f"<h2>Regions</h2><p class=\"meta\">Share: the region's part of the model's time in the plan; "
            f"contribution: share × (1 − 1/kernel speedup), the part of the model's time the kernel removed.</p>"
            f"{table}")
    return page(f"kernelagent whole model {name}", body)

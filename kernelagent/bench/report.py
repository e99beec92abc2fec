"""Reports of a bench run, from the store: summary.json, problems.csv and report.html.

report.html is one self-contained file: inline CSS, charts as inline SVG (svg.py), a few
lines of inline JavaScript to sort the table; no external resource of any kind, so it
opens offline. `write_compare` puts two runs side by side (compare.json, compare.html).

Reasons, problem keys and statuses may be a candidate's or a file's text: every string goes
into the HTML through kernelagent.text.html_text (control characters, escape sequences,
noncharacters and lone surrogates dropped, then html.escape), and into the CSV through
clean_text.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from kernelagent.bench import metrics as M
from kernelagent.bench import svg
from kernelagent.bench.store import Store, default_store_path
from kernelagent.errors import UserError
from kernelagent.html_page import cards as _card_row
from kernelagent.html_page import cell as _cell
from kernelagent.html_page import page as _page
from kernelagent.text import clean_text
from kernelagent.text import html_text as escape

CSV_FIELDS = ["key", "level", "name", "status", "compiled", "correct", "samples", "correct_samples",
              "speedup_eager", "speedup_eager_low", "speedup_eager_high", "speedup_inductor",
              "speedup_inductor_low", "speedup_inductor_high", "other_baselines", "timings_meaningful", "tokens_prompt", "tokens_completion",
              "tokens_total", "cost_usd", "wall_s", "evaluations", "reused", "reason"]
HIST_EDGES = [0.0, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0]


# -- loading ------------------------------------------------------------------------------
def resolve_run(ref: str, store: str | None = None) -> tuple[Path, str]:
    """RUN may be a run directory (with run.json), a run.json file, or a run id in the store."""
    path = Path(ref)
    run_json = path / "run.json" if path.is_dir() else (path if path.name == "run.json" and path.is_file() else None)
    if run_json is not None and run_json.is_file():
        data = json.loads(run_json.read_text())
        return Path(store) if store else Path(data["store"]), data["run_id"]
    if path.is_dir():
        raise UserError(f"{ref} is a folder without run.json (not a bench run directory)")
    store_path = Path(store) if store else default_store_path()
    if not store_path.is_file():
        raise UserError(f"no bench store at {store_path} (give --store or a run directory)")
    return store_path, ref


def load_run(store: Store, run_id: str) -> dict[str, Any]:
    run = store.run(run_id)
    if run is None:
        ids = ", ".join(r["id"] for r in store.runs()[-5:]) or "none"
        raise UserError(f"no run {run_id!r} in {store.path} (latest: {ids})")
    rows = store.problems(run_id)
    records = [r["record"] for r in rows if r["record"] is not None]
    attempts = store.attempts(run_id)
    from kernelagent.bench.cost import run_cost

    return {"run": run, "records": records, "pending": [r["key"] for r in rows if r["record"] is None],
            "metrics": M.compute(records), "store": str(store.path),
            "cost": run_cost(store, run_id, float(run.get("wall_s") or 0.0)),
            "evaluations": {"performed": store.evaluations_performed(run_id),
                            "reused": sum(1 for a in attempts if a["reused"]), "attempts": len(attempts)}}


# -- writing ------------------------------------------------------------------------------
def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def write_run_json(out_dir: Path, run_id: str, store_path: Path) -> None:
    """run.json makes a run directory an argument for `kernelagent report`."""
    _atomic_write(Path(out_dir) / "run.json",
                  json.dumps({"run_id": run_id, "store": str(Path(store_path).resolve())}, indent=2) + "\n")


def summary_json(data: dict) -> dict:
    run = data["run"]
    return {"format_version": 1, "run": {k: run.get(k) for k in ("id", "mode", "status", "spec", "created", "updated",
                                                                  "wall_s", "sessions", "fingerprint", "out_dir")},
            "store": data["store"], "metrics": data["metrics"], "evaluations": data["evaluations"],
            "cost": data.get("cost"),
            "pending": data["pending"], "problems": data["records"]}


def problems_csv(records: list[dict]) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in records:
        tokens = r.get("tokens") or {}
        bounds = {f"speedup_{b}_{end}": (M.interval(r, b) or [None, None])[i]
                  for b in M.BASELINES for i, end in enumerate(("low", "high"))}
        row = {**{k: r.get(k) for k in CSV_FIELDS}, **bounds, "other_baselines": _other_baselines(r),
               "tokens_prompt": tokens.get("prompt", 0),
               "tokens_completion": tokens.get("completion", 0), "tokens_total": tokens.get("total", 0),
               "reason": (r.get("reason") or "").replace("\n", " ")}
        writer.writerow({k: clean_text(v) if isinstance(v, str) else v for k, v in row.items()})
    return buffer.getvalue()


def write_reports(store: Store, run_id: str, out_dir: str | Path) -> dict[str, Path]:
    data = load_run(store, run_id)
    out = Path(out_dir)
    paths = {"summary": out / "summary.json", "csv": out / "problems.csv", "html": out / "report.html"}
    write_run_json(out, run_id, store.path)
    _atomic_write(paths["summary"], json.dumps(summary_json(data), indent=2, default=str) + "\n")
    _atomic_write(paths["csv"], problems_csv(data["records"]))
    _atomic_write(paths["html"], render_html(data))
    return paths


def restrict_to_shared(a: dict, b: dict) -> str | None:
    """Two runs over different problem sets are compared on the problems they share (else
    B - A would mix a change of model with a change of problems). Both are cut down in
    place; returns a one-line note saying so, or None when the sets are the same."""
    keys = [{r["key"] for r in d["records"]} | set(d["pending"]) for d in (a, b)]
    if keys[0] == keys[1]:
        return None
    shared = keys[0] & keys[1]
    if not shared:
        raise UserError(f"runs {a['run']['id']} and {b['run']['id']} share no problem: nothing to compare")
    for d in (a, b):
        d["records"] = [r for r in d["records"] if r["key"] in shared]
        d["pending"] = [k for k in d["pending"] if k in shared]
        d["metrics"] = M.compute(d["records"])
    note = (f"the runs' problem sets differ: compared on the {len(shared)} shared problems "
            f"({len(keys[0] - shared)} only in A, {len(keys[1] - shared)} only in B)")
    a["compare_note"] = note
    a["compare_problems"] = {"shared": len(shared), "only_a": sorted(keys[0] - shared),
                             "only_b": sorted(keys[1] - shared)}
    return note


def write_compare(a: dict, b: dict, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    paths = {"summary": out / "compare.json", "html": out / "compare.html"}
    payload = {"format_version": 1, "a": summary_json(a), "b": summary_json(b)}
    if a.get("compare_note"):
        payload["problems"] = a["compare_problems"]
        payload["note"] = a["compare_note"]
    _atomic_write(paths["summary"], json.dumps(payload, indent=2, default=str) + "\n")
    _atomic_write(paths["html"], render_compare(a, b))
    return paths


# -- HTML ---------------------------------------------------------------------------------
def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}x"


def _xi(record: dict, baseline: str) -> str:
    """Point estimate and 95% interval, e.g. "1.120x [0.950, 1.300]" (the point alone without one)."""
    point = M.speedup(record, baseline)
    bounds = M.interval(record, baseline)
    return _x(point) + (f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else "")


def baseline_label(name: str) -> str:
    """A result's baseline name as shown: compile -> TorchInductor, compile:MODE -> Inductor MODE."""
    if name == "compile":
        return "TorchInductor"
    if name.startswith("compile:"):
        return f"Inductor {name.split(':', 1)[1]}"
    return name


def _other_baselines(record: dict) -> str:
    """Speedups over the Inductor modes beyond the default (--inductor-modes), each by its name."""
    if not record.get("correct"):
        return ""
    speedups, intervals = record.get("raw_speedups") or {}, record.get("raw_intervals") or {}
    parts = []
    for name in sorted(speedups):
        if not name.startswith("compile:") or speedups[name] is None:
            continue
        bounds = intervals.get(name)
        parts.append(f"{baseline_label(name)} {speedups[name]:.3f}x"
                     + (f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds and len(bounds) == 2 else ""))
    return "; ".join(parts)


def _num(v: Any, fmt: str = "{:.3f}") -> str:
    return "–" if v is None else fmt.format(v)


def _cards(m: dict) -> str:
    items = [("problems", str(m["problems"])), ("compile rate", _pct(m["compile_rate"])),
             ("correctness rate", _pct(m["correctness_rate"])),
             ("geomean vs inductor", _x(m["geomean_speedup"]["inductor"])),
             ("geomean vs eager", _x(m["geomean_speedup"]["eager"])),
             ("fast_1.0 vs inductor (lower bound)", _pct(m["fast_p"]["inductor"]["1.0"])),
             ("fast_1.0 vs inductor (point)", _pct(m.get("fast_p_point", m["fast_p"])["inductor"]["1.0"])),
             ("tokens", f"{m['tokens']['total']:,}"), ("cost", f"${m['cost_usd']:.4f}"),
             ("wall (sum over problems)", f"{m['wall_s']:.1f} s")]
    return _card_row(items)


def _fast_table(columns: list[tuple[str, dict]]) -> str:
    head = "".join(f"<th>{escape(name)} vs {b}</th>" for name, _ in columns for b in M.BASELINES)
    rows = []
    for key, what in (("fast_p", "lower bound"), ("fast_p_point", "point estimate")):
        for p in M.THRESHOLDS:
            label = M.p_label(p)
            cells = "".join(f'<td class="num">{_pct(m.get(key, m["fast_p"])[b][label])}</td>'
                            for _, m in columns for b in M.BASELINES)
            rows.append(f"<tr><td>fast_{label} ({what})</td>{cells}</tr>")
    geo = "".join(f'<td class="num">{_x(m["geomean_speedup"][b])} (n={m["measured"][b]})</td>'
                  for _, m in columns for b in M.BASELINES)
    rows.append(f"<tr><td>geomean speedup (correct)</td>{geo}</tr>")
    point_only = "; ".join(f"{escape(name) + ' ' if name else ''}{b}: {m.get('point_only', {}).get(b, 0)}"
                           for name, m in columns for b in M.BASELINES)
    return (f'<table id="fast-p"><thead><tr><th>metric</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f'<p class="meta">fast_p (lower bound): {escape(M.FAST_P_RULE)}. Measured problems without an '
            f'interval (decided on the point estimate): {point_only}. The geometric mean uses point estimates.</p>')


def _level_table(m: dict) -> str:
    rows = []
    for level, lm in m.get("by_level", {}).items():
        rows.append("<tr>" + "".join([
            f"<td>{escape(level)}</td>", f'<td class="num">{lm["problems"]}</td>',
            f'<td class="num">{_pct(lm["compile_rate"])}</td>', f'<td class="num">{_pct(lm["correctness_rate"])}</td>',
            *(f'<td class="num">{_pct(lm["fast_p"][b][M.p_label(p)])}</td>' for b in M.BASELINES
              for p in (0.0, 1.0)),
            f'<td class="num">{_x(lm["geomean_speedup"]["inductor"])}</td>',
            f'<td class="num">{lm["tokens"]["total"]:,}</td>', f'<td class="num">${lm["cost_usd"]:.4f}</td>',
            f'<td class="num">{lm["wall_s"]:.1f}</td>']) + "</tr>")
    head = ("<th>level</th><th>problems</th><th>compile</th><th>correct</th><th>fast_0 eager</th>"
            "<th>fast_1.0 eager</th><th>fast_0 inductor</th><th>fast_1.0 inductor</th><th>geomean vs inductor</th>"
            "<th>tokens</th><th>cost</th><th>wall s</th>")
    return f'<table id="levels"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _pass_table(m: dict) -> str:
    if not m["pass_at_k"]:
        return ""
    head = "".join(f"<th>pass@{k}</th>" for k in m["pass_at_k"])
    cells = "".join(f'<td class="num">{_pct(v["value"])} <small>({v["problems"]} problems)</small></td>'
                    for v in m["pass_at_k"].values())
    counts = {v["problems"] for v in m["pass_at_k"].values()}
    # A problem enters pass@k only with at least k samples: over fewer problems, pass@2 can read
    # below pass@1 (issue 56: it read as a bug). The page says so wherever the counts differ.
    note = ('<p class="meta">Each k is over the problems with at least k samples (the counts beside each '
            'value), so a larger k can read lower when it covers other problems.</p>' if len(counts) > 1 else "")
    return (f'<h2>pass@k (samples per problem: up to {m["max_samples"]})</h2>'
            f'<table id="pass-at-k"><thead><tr>{head}</tr></thead><tbody><tr>{cells}</tr></tbody></table>{note}')


def _problem_table(records: list[dict]) -> str:
    rows = []
    for r in records:
        tokens = (r.get("tokens") or {}).get("total") or 0
        samples = f'{r.get("correct_samples", 0)}/{r.get("samples", 0)}'
        cls = "ok" if r.get("correct") else "bad"
        rows.append(f'<tr class="{cls}">' + "".join([
            _cell(r["key"]), _cell(r.get("status") or "?", cls="st"), _cell("yes" if r.get("compiled") else "no"),
            _cell("yes" if r.get("correct") else "no"), _cell(samples, r.get("correct_samples", 0), "num"),
            _cell(_xi(r, "eager"), r.get("speedup_eager") if r.get("speedup_eager") is not None else -1, "num"),
            _cell(_xi(r, "inductor"),
                  r.get("speedup_inductor") if r.get("speedup_inductor") is not None else -1, "num"),
            _cell(_other_baselines(r)),
            _cell(f"{tokens:,}", tokens, "num"), _cell(f'${float(r.get("cost_usd") or 0):.4f}', r.get("cost_usd") or 0,
                                                        "num"),
            _cell(_num(r.get("wall_s"), "{:.1f}"), r.get("wall_s") or 0, "num"),
            _cell((r.get("reason") or "")[:160])]) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("problem", "status", "compiled", "correct", "correct samples",
                                               "vs eager [95% interval]", "vs inductor [95% interval]",
                                               "other Inductor modes", "tokens", "cost", "wall s", "reason"))
    return (f'<table class="sortable" id="problems"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _search_table(records: list[dict]) -> str:
    """Agent runs with a search strategy: per problem the tree's size, the best speedup after each
    round (the interval's low end decides; timings on the CPU are not meaningful) and the spend."""
    rows = []
    for r in records:
        s = r.get("search")
        if not s:
            continue
        size, spend = s.get("size") or {}, s.get("spend") or {}
        rounds = " → ".join(f'r{x["round"]}: {_x(x.get("best_speedup")) if x.get("best_speedup") is not None else "–"}'
                            for x in s.get("best_by_round") or [])
        rows.append("<tr>" + "".join([
            _cell(r["key"]), _cell(f'{s.get("strategy")} ×{s.get("samples")}'),
            _cell(str(size.get("nodes", 0)), size.get("nodes", 0), "num"),
            _cell(str(size.get("evaluated", 0)), size.get("evaluated", 0), "num"),
            _cell(str(size.get("duplicates", 0)), size.get("duplicates", 0), "num"),
            _cell(str(size.get("correct", 0)), size.get("correct", 0), "num"),
            _cell(rounds or "–"),
            _cell(str(spend.get("model_calls", 0)), spend.get("model_calls", 0), "num"),
            _cell(f'{int(spend.get("tokens") or 0):,}', spend.get("tokens") or 0, "num"),
            _cell(f'${float(spend.get("cost_usd") or 0):.4f}', spend.get("cost_usd") or 0, "num")]) + "</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("problem", "strategy", "nodes", "evaluated", "duplicates",
                                               "correct", "best speedup by round", "model calls", "tokens",
                                               "cost"))
    return (f'<h2>Search</h2><table class="sortable" id="search"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _speedups(records: list[dict], baseline: str) -> list[float]:
    return [s for r in records if (s := M.speedup(r, baseline)) is not None]


NO_TIMINGS = "no measured speedups (timings are not meaningful on the CPU)"


def _plots(records: list[dict]) -> str:
    eager, inductor = _speedups(records, "eager"), _speedups(records, "inductor")
    hist = svg.histogram("plot-speedups", "Speedup distribution (correct problems)", HIST_EDGES,
                         [("vs eager", svg.COLORS["eager"], eager), ("vs inductor", svg.COLORS["inductor"], inductor)],
                         "speedup (×)", empty=None if eager or inductor else NO_TIMINGS)
    series, markers = [], []
    for b in M.BASELINES:
        series.append((f"vs {b}", svg.COLORS[b], M.fast_curve(records, b)))
        for p in M.THRESHOLDS:
            v = M.fast_p(records, b, p) or 0.0
            markers.append((f"fast_{M.p_label(p)} vs {b} = {v:.3f}", svg.COLORS[b], p, v))
    fast = svg.line_chart("plot-fast-p", "fast_p against the threshold p", series, "threshold p (speedup >)",
                          "fraction of all problems", markers,
                          empty=None if eager or inductor else NO_TIMINGS)
    return '<div class="plots">' + hist + fast + _cost_plot(records) + "</div>"


def _cost_axis(records: list[dict]) -> tuple[str, str]:
    if any(float(r.get("cost_usd") or 0) > 0 for r in records):
        return "cost_usd", "cost per problem (USD)"
    if any(int((r.get("tokens") or {}).get("total") or 0) > 0 for r in records):
        return "tokens", "tokens per problem (cost unknown)"
    return "wall_s", "wall seconds per problem (no model cost)"


def _cost_value(r: dict, field: str) -> float:
    return float((r.get("tokens") or {}).get("total") or 0) if field == "tokens" else float(r.get(field) or 0.0)


def _cost_plot(records: list[dict], name: str = "plot-cost") -> str:
    field, label = _cost_axis(records)
    points = []
    for r in records:
        for b in ("inductor", "eager"):
            s = M.speedup(r, b)
            if s is not None:
                points.append((_cost_value(r, field), s, f"{r['key']}: {s:.3f}x vs {b}, {label.split(' (')[0]} "
                               f"{_cost_value(r, field):.4g}", svg.COLORS[b]))
                break
    return svg.scatter(name, "Cost against speedup", points, label, "speedup (× vs inductor, else eager)",
                       legend=[("vs inductor", svg.COLORS["inductor"]), ("vs eager", svg.COLORS["eager"])],
                       empty=NO_TIMINGS)


def _env(run: dict) -> str:
    fp = run.get("fingerprint") or {}
    device = fp.get("gpu_name") or ("CPU (Triton interpreter)" if fp and not fp.get("cuda") else "?")
    bits = [f"device {device}", f"torch {fp.get('torch')}", f"triton {fp.get('triton')}", f"python {fp.get('python')}"]
    if fp.get("driver"):
        bits.insert(1, f"driver {fp['driver']}")
    from kernelagent.bench.dispatch import harness_text

    if harness := harness_text(fp.get("harness")):  # the latest session's (each result's isolation.daemon)
        bits.append(f"harness: {harness}")
    return " · ".join(bits)


def _header(data: dict) -> str:
    run, spec = data["run"], data["run"]["spec"]
    created = dt.datetime.fromtimestamp(run["created"]).strftime("%Y-%m-%d %H:%M")
    what = (f"candidates from {spec.get('candidates')}" if run["mode"] == "candidates"
            else f"agent: model {spec.get('model')}, {spec.get('max_turns')} turns max"
            + (f", strategy {spec.get('strategy')} ×{spec.get('samples')}" if spec.get("strategy", "single") != "single"
               else ""))
    ev = data["evaluations"]
    return (f'<p class="meta">{escape(what)} · problems from {escape(str(spec.get("root")))} · created {created} · '
            f'status {escape(run["status"])} · {run["sessions"]} session(s), {run["wall_s"]:.1f} s wall · '
            f'{ev["performed"]} evaluations performed, {ev["reused"]} answered from the store</p>'
            f'<p class="meta">{escape(_env(run))}</p>')


def render_html(data: dict) -> str:
    m, records = data["metrics"], data["records"]
    note = ""
    if records and not m["timings_meaningful"]:
        note = ('<p class="note">Timings were taken on the CPU under the Triton interpreter: they are not '
                'meaningful, so no speedup is reported and every fast_p is 0.</p>')
    if data["pending"]:
        note += f'<p class="note">{len(data["pending"])} problem(s) not finished yet: metrics cover the finished ones.</p>'
    if m.get("skipped"):
        items = "".join(f"<li>{escape(str(s['key']))}: {escape(s['reason'])}</li>" for s in m["skipped"])
        note += (f'<p class="note">{len(m["skipped"])} problem(s) skipped, left out of every rate:</p>'
                 f'<ul id="skipped">{items}</ul>')
    body = (f'<h1>kernelagent bench: {escape(data["run"]["id"])}</h1>{_header(data)}{note}{_cards(m)}'
            f'<h2>fast_p and speedups</h2>{_fast_table([("", m)])}'
            f'<h2>Plots</h2>{_plots(records)}'
            f'<h2>By level</h2>{_level_table(m)}{_pass_table(m)}'
            f'<h2>Problems</h2>{_problem_table(records)}{_search_table(records)}')
    return _page(f"kernelagent bench {data['run']['id']}", body)


# -- compare ------------------------------------------------------------------------------
def _metric_rows(a: dict, b: dict) -> str:
    ma, mb = a["metrics"], b["metrics"]

    def row(label: str, va: float | None, vb: float | None, fmt) -> str:
        if va is None or vb is None:
            delta = "–"
        elif fmt is pct:  # percentage points
            delta = f"{100 * (vb - va):+.1f} pp"
        else:
            delta = ("+" if vb - va >= 0 else "") + fmt(vb - va).rstrip("x")
        return (f'<tr><td>{escape(label)}</td><td class="num">{fmt(va)}</td><td class="num">{fmt(vb)}</td>'
                f'<td class="num">{escape(delta)}</td></tr>')

    pct = lambda v: _pct(v)  # noqa: E731
    rows = [row("compile rate", ma["compile_rate"], mb["compile_rate"], pct),
            row("correctness rate", ma["correctness_rate"], mb["correctness_rate"], pct)]
    for b_ in M.BASELINES:
        for p in M.THRESHOLDS:
            label = M.p_label(p)
            rows.append(row(f"fast_{label} vs {b_}", ma["fast_p"][b_][label], mb["fast_p"][b_][label], pct))
        rows.append(row(f"geomean speedup vs {b_}", ma["geomean_speedup"][b_], mb["geomean_speedup"][b_], _x))
    rows.append(row("tokens", ma["tokens"]["total"], mb["tokens"]["total"], lambda v: "–" if v is None else f"{v:,}"))
    rows.append(row("cost (USD)", ma["cost_usd"], mb["cost_usd"], lambda v: "–" if v is None else f"{v:.4f}"))
    rows.append(row("wall s (sum over problems)", ma["wall_s"], mb["wall_s"],
                    lambda v: "–" if v is None else f"{v:.1f}"))
    return ('<table id="compare-metrics"><thead><tr><th>metric</th><th>A</th><th>B</th><th>B − A</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _compare_problems(a: dict, b: dict) -> str:
    ra = {r["key"]: r for r in a["records"]}
    rb = {r["key"]: r for r in b["records"]}
    keys = list(ra) + [k for k in rb if k not in ra]
    rows = []
    for k in keys:
        x, y = ra.get(k, {}), rb.get(k, {})
        best = lambda r: M.speedup(r, "inductor") or M.speedup(r, "eager")  # noqa: E731
        rows.append("<tr>" + "".join([
            _cell(k), _cell(x.get("status", "–"), cls="st"), _cell(_x(M.speedup(x, "eager")), best(x) or -1, "num"),
            _cell(_x(M.speedup(x, "inductor")), M.speedup(x, "inductor") or -1, "num"),
            _cell(y.get("status", "–"), cls="st"), _cell(_x(M.speedup(y, "eager")), best(y) or -1, "num"),
            _cell(_x(M.speedup(y, "inductor")), M.speedup(y, "inductor") or -1, "num")]) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("problem", "A status", "A vs eager", "A vs inductor",
                                               "B status", "B vs eager", "B vs inductor"))
    return (f'<table class="sortable" id="compare-problems"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def render_compare(a: dict, b: dict) -> str:
    ra = {r["key"]: r for r in a["records"]}
    series, markers = [], []
    for tag, data in (("A", a), ("B", b)):
        for base in M.BASELINES:
            color = {"A": {"eager": "#1f77b4", "inductor": "#d62728"},
                     "B": {"eager": "#17becf", "inductor": "#ff7f0e"}}[tag][base]
            series.append((f"{tag} vs {base}", color, M.fast_curve(data["records"], base)))
            for p in M.THRESHOLDS:
                v = M.fast_p(data["records"], base, p) or 0.0
                markers.append((f"{tag}: fast_{M.p_label(p)} vs {base} = {v:.3f}", color, p, v))
    measured = any(M.speedup(r, base) is not None for d in (a, b) for r in d["records"] for base in M.BASELINES)
    fast = svg.line_chart("plot-fast-p", "fast_p against p (A and B)", series, "threshold p (speedup >)",
                          "fraction of all problems", markers, empty=None if measured else NO_TIMINGS)
    pairs = []
    for r in b["records"]:
        other = ra.get(r["key"])
        if other is None:
            continue
        for base in ("inductor", "eager"):
            sa, sb = M.speedup(other, base), M.speedup(r, base)
            if sa is not None and sb is not None:
                pairs.append((sa, sb, f"{r['key']}: A {sa:.3f}x, B {sb:.3f}x vs {base}", svg.COLORS[base]))
                break
    versus = svg.scatter("plot-versus", "Per-problem speedup: A against B", pairs, "A speedup (×)", "B speedup (×)",
                         log_x=True, log_y=True, diagonal=True, hline=None,
                         legend=[("vs inductor", svg.COLORS["inductor"]), ("vs eager", svg.COLORS["eager"])],
                         empty="no problem has a measured speedup in both runs")
    hist = svg.histogram("plot-speedups", "Speedup distribution vs inductor (else eager)", HIST_EDGES,
                         [("A", svg.COLORS["A"], [M.speedup(r, "inductor") or M.speedup(r, "eager") for r in a["records"]
                                                  if M.speedup(r, "inductor") or M.speedup(r, "eager")]),
                          ("B", svg.COLORS["B"], [M.speedup(r, "inductor") or M.speedup(r, "eager") for r in b["records"]
                                                  if M.speedup(r, "inductor") or M.speedup(r, "eager")])],
                         "speedup (×)", empty=None if measured else NO_TIMINGS)
    body = (f'<h1>kernelagent bench: A = {escape(a["run"]["id"])} vs B = {escape(b["run"]["id"])}</h1>'
            + (f'<p class="note">{escape(a["compare_note"])}</p>' if a.get("compare_note") else "")
            + f'<h3>A</h3>{_header(a)}<h3>B</h3>{_header(b)}'
            f'<h2>Metrics</h2>{_metric_rows(a, b)}'
            f'<h2>Plots</h2><div class="plots">{fast}{versus}{hist}</div>'
            f'<h2>Problems</h2>{_compare_problems(a, b)}')
    return _page(f"kernelagent bench {a['run']['id']} vs {b['run']['id']}", body)

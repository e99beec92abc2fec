"""The look of kernelagent's HTML reports, in one place: a bench run's report.html (bench/report.py)
and a whole model's (orchestrate/whole_report.py) share the style, the sortable tables and the
page around them. One self-contained file: inline CSS, a few lines of inline JavaScript, no
external resource. Every string goes in through kernelagent.text.html_text."""

from __future__ import annotations

from typing import Any

from kernelagent.text import html_text as escape

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.meta { color: #555; font-size: 13px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 10px 14px; min-width: 140px; }
.card .v { font-size: 22px; font-weight: 600; } .card .k { font-size: 12px; color: #666; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 4px 10px; text-align: left; }
th { background: #f6f6f6; cursor: pointer; user-select: none; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.ok td.st { color: #137333; font-weight: 600; } tr.bad td.st { color: #b3261e; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; }
svg.plot { border: 1px solid #ddd; border-radius: 6px; background: #fff; }
svg .title { font-size: 14px; font-weight: 600; } svg .tick, svg .legend { font-size: 11px; fill: #444; }
svg .label { font-size: 12px; fill: #222; } svg .empty { font-size: 13px; fill: #888; }
svg .axis { stroke: #333; } svg .grid { stroke: #eee; } svg .ref { stroke: #999; stroke-dasharray: 4 3; }
.note { background: #fff8e1; border: 1px solid #f0d58c; padding: 6px 10px; border-radius: 4px; font-size: 13px; }
"""

SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var asc = th.getAttribute("data-dir") !== "asc";
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute("data-v"), y = b.cells[col].getAttribute("data-v");
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
      th.setAttribute("data-dir", asc ? "asc" : "desc");
    });
  });
});
"""


def cell(text: str, sort: Any = None, cls: str = "") -> str:
    sort = text if sort is None else sort
    c = f' class="{cls}"' if cls else ""
    return f'<td{c} data-v="{escape(str(sort))}">{escape(text)}</td>'


def page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}<script>{SORT_JS}</script></body></html>\n")


def cards(items: list[tuple[str, str]]) -> str:
    """A row of cards: (label, value) each, the value large."""
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{escape(v)}</div><div class="k">{escape(k)}</div></div>' for k, v in items
    ) + "</div>"

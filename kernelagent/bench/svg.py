"""Small SVG charts drawn by hand (no plotting library, no JavaScript, no network): a
report that embeds them opens offline in any browser.

Every chart is an <svg class="plot"> with `data-points` = the number of data marks drawn;
data marks carry class "point" (circles), "bar" (rects) or "series" (polylines), each with a
<title> tooltip. Every string (tooltips name problems) is escaped by kernelagent.text.html_text.
"""

from __future__ import annotations

import math

from kernelagent.text import html_text as escape

W, H = 560, 320
LEFT, RIGHT, TOP, BOTTOM = 62, 18, 46, 52

COLORS = {"eager": "#1f77b4", "inductor": "#d62728", "A": "#1f77b4", "B": "#ff7f0e"}


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    ticks, v = [], start
    while v <= hi + 1e-9 * step:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for e in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1):
        ticks.append(2.0 ** e)
    return [t for t in ticks if lo <= t <= hi] or [lo, hi]


class Axes:
    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], *, log_x: bool = False,
                 log_y: bool = False):
        self.log_x, self.log_y = log_x, log_y
        self.x0, self.x1 = (math.log2(v) for v in x_range) if log_x else x_range
        self.y0, self.y1 = (math.log2(v) for v in y_range) if log_y else y_range
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1

    def x(self, v: float) -> float:
        v = math.log2(v) if self.log_x else v
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        v = math.log2(v) if self.log_y else v
        return H - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)

    def frame(self, title: str, x_label: str, y_label: str, x_ticks: list[float], y_ticks: list[float],
              x_tick_labels: list[str] | None = None) -> list[str]:
        parts = [f'<text class="title" x="{W / 2:.1f}" y="18" text-anchor="middle">{escape(title)}</text>',
                 f'<line class="axis" x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}"/>',
                 f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}"/>']
        for i, t in enumerate(x_ticks):
            x = self.x(t)
            label = x_tick_labels[i] if x_tick_labels else _fmt(t)
            parts.append(f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}"/>')
            parts.append(f'<text class="tick" x="{x:.1f}" y="{H - BOTTOM + 15}" text-anchor="middle">{escape(label)}</text>')
        for t in y_ticks:
            y = self.y(t)
            parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
            parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(t))}</text>')
        parts.append(f'<text class="label" x="{(LEFT + W - RIGHT) / 2:.1f}" y="{H - 12}" text-anchor="middle">'
                     f'{escape(x_label)}</text>')
        parts.append(f'<text class="label" transform="translate(16 {(TOP + H - BOTTOM) / 2:.1f}) rotate(-90)" '
                     f'text-anchor="middle">{escape(y_label)}</text>')
        return parts


def _svg(parts: list[str], points: int, name: str, empty: str | None = None) -> str:
    if empty:
        parts.append(f'<text class="empty" x="{W / 2:.1f}" y="{H / 2:.1f}" text-anchor="middle">{escape(empty)}</text>')
    return (f'<svg class="plot" id="{escape(name)}" data-points="{points}" '
            f'viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">' + "".join(parts) + "</svg>")


def _legend(items: list[tuple[str, str]], x: float = LEFT, y: float = 26) -> list[str]:
    """One row under the title, above the plot area (never over the data)."""
    parts = []
    for label, color in items:
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="10" fill="{color}"/>')
        parts.append(f'<text class="legend" x="{x + 16:.1f}" y="{y + 9:.1f}">{escape(label)}</text>')
        x += 30 + 6.5 * len(label)
    return parts


def line_chart(name: str, title: str, series: list[tuple[str, str, list[tuple[float, float]]]],
               x_label: str, y_label: str, markers: list[tuple[str, str, float, float]] | None = None,
               y_range: tuple[float, float] = (0.0, 1.0), empty: str | None = None) -> str:
    """series: (label, color, [(x, y)]); markers: (label, color, x, y) circles."""
    xs = [x for _, _, pts in series for x, _ in pts] or [0.0, 1.0]
    axes = Axes((min(xs), max(xs)), y_range)
    parts = axes.frame(title, x_label, y_label, _nice_ticks(min(xs), max(xs)), _nice_ticks(*y_range))
    n = 0
    for label, color, pts in series:
        if not pts or empty:
            continue
        coords = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in pts)
        parts.append(f'<polyline class="series" fill="none" stroke="{color}" stroke-width="2" points="{coords}">'
                     f'<title>{escape(label)}</title></polyline>')
    for label, color, x, y in ([] if empty else markers or []):
        n += 1
        parts.append(f'<circle class="point" cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="4" fill="{color}">'
                     f'<title>{escape(label)}</title></circle>')
    parts += _legend([(label, color) for label, color, _ in series])
    return _svg(parts, n, name, empty)


def histogram(name: str, title: str, edges: list[float], series: list[tuple[str, str, list[float]]],
              x_label: str, empty: str | None = None) -> str:
    """Counts of values per bin [edges[i], edges[i+1]); bins are drawn with equal widths."""
    nbins = len(edges) - 1
    counts = []
    for _label, _color, values in series:
        c = [0] * nbins
        for v in values:
            for i in range(nbins):
                if edges[i] <= v < edges[i + 1] or (i == nbins - 1 and v >= edges[-1]):
                    c[i] += 1
                    break
        counts.append(c)
    top = max([max(c) for c in counts if c] + [1])
    axes = Axes((0, nbins), (0, top))
    labels = [("<" + _fmt(edges[1])) if i == 0 else (("≥" + _fmt(edges[i])) if i == nbins - 1 else _fmt(edges[i]))
              for i in range(nbins)]
    parts = axes.frame(title, x_label, "problems", [i + 0.5 for i in range(nbins)],
                       [t for t in _nice_ticks(0, top) if float(t).is_integer()], labels)
    n = 0
    width = (axes.x(1) - axes.x(0)) * 0.8 / max(1, len(series))
    for s, (label, color, _values) in enumerate(series):
        for i, count in enumerate(counts[s]):
            if not count:
                continue
            n += 1
            x = axes.x(i) + (axes.x(1) - axes.x(0)) * 0.1 + s * width
            y = axes.y(count)
            hi = "∞" if i == nbins - 1 else _fmt(edges[i + 1])
            parts.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" '
                         f'height="{H - BOTTOM - y:.1f}" fill="{color}"><title>{escape(label)}: {count} in '
                         f'[{_fmt(edges[i])}, {hi})</title></rect>')
    if 1.0 in edges:
        x = axes.x(edges.index(1.0))
        parts.append(f'<line class="ref" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}"/>')
    parts += _legend([(label, color) for label, color, _ in series])
    return _svg(parts, n, name, empty)


def scatter(name: str, title: str, points: list[tuple[float, float, str, str]], x_label: str, y_label: str,
            *, log_x: bool = False, log_y: bool = True, diagonal: bool = False, hline: float | None = 1.0,
            legend: list[tuple[str, str]] | None = None, empty: str | None = None) -> str:
    """points: (x, y, tooltip, color). Log axes are base 2."""
    pts = [(x, y, t, c) for x, y, t, c in points if (not log_x or x > 0) and (not log_y or y > 0)]
    xs = [p[0] for p in pts] or [1.0]
    ys = [p[1] for p in pts] or [1.0]
    if diagonal:
        lo, hi = min(xs + ys), max(xs + ys)
        x_range = y_range = ((lo / 1.25, hi * 1.25) if log_x else (0.0, hi * 1.1 or 1.0))
    else:
        x_range = (min(xs) / 1.25, max(xs) * 1.25) if log_x else (0.0, (max(xs) * 1.1) or 1.0)
        y_lo, y_hi = min(ys + ([hline] if hline else [])), max(ys + ([hline] if hline else []))
        y_range = (y_lo / 1.25, y_hi * 1.25) if log_y else (0.0, y_hi * 1.1 or 1.0)
    axes = Axes(x_range, y_range, log_x=log_x, log_y=log_y)
    x_ticks = _log_ticks(*x_range) if log_x else _nice_ticks(*x_range)
    y_ticks = _log_ticks(*y_range) if log_y else _nice_ticks(*y_range)
    parts = axes.frame(title, x_label, y_label, x_ticks, y_ticks)
    if hline and not diagonal and pts:  # no line through the "no data" text
        y = axes.y(hline)
        parts.append(f'<line class="ref" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
    if diagonal:
        a, b = x_range
        parts.append(f'<line class="ref" x1="{axes.x(a):.1f}" y1="{axes.y(a):.1f}" x2="{axes.x(b):.1f}" '
                     f'y2="{axes.y(b):.1f}"/>')
    for x, y, tip, color in pts:
        parts.append(f'<circle class="point" cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="4.5" fill="{color}" '
                     f'fill-opacity="0.8"><title>{escape(tip)}</title></circle>')
    if legend:
        parts += _legend(legend)
    return _svg(parts, len(pts), name, empty if not pts else None)

"""Metrics over a run's per-problem records (definitions in docs/guides/bench.md, "Metrics").

A record (built by runner.py, stored in the `problems` table) has, among others:
    key, level, status, compiled, correct (EvalResult.passed of the best sample: correct AND
    nothing rejected or flagged for review), speedup_eager, speedup_inductor (point estimates;
    None unless the timings were meaningful: on a GPU, never on the CPU interpreter),
    interval_eager, interval_inductor ([low, high], the 95% bootstrap interval of that speedup,
    EvalResult.speedup_intervals; None where none was measured), samples, correct_samples,
    tokens {prompt, completion, total}, cost_usd, wall_s.
`fast_p` decides on the LOW end of the interval where a record has one, and on the point
estimate otherwise (`fast_p_point` is the same count on point estimates only, for comparison;
`point_only` says how many measured records had no interval). Geometric means and plots use
the point estimates.
Every rate is over ALL problems of the run, including those without a candidate or that
failed in any way, except the skipped ones (status "skipped": not evaluated for a reason that
is neither the candidate's nor the agent's, such as a package the problem needs that is not
installed; or status "too_large": the problem does not fit this machine's memory); those are
listed under "skipped".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

THRESHOLDS = (0.0, 1.0, 1.5, 2.0)
BASELINES = {"eager": "speedup_eager", "inductor": "speedup_inductor"}
INTERVALS = {"eager": "interval_eager", "inductor": "interval_inductor"}
FAST_P_RULE = ("correct, and the lower bound of the speedup's 95% interval is above p "
               "(the point estimate where no interval was measured)")


def p_label(p: float) -> str:
    return "0" if p == 0 else f"{p:.1f}"


def _rate(n: int, total: int) -> float | None:
    return n / total if total else None


# Statuses that leave a problem out of every rate: not evaluated ("skipped": a package it needs is
# missing) or not judgeable on this machine ("too_large": its inputs do not fit in memory).
SKIPPED_STATUSES = ("skipped", "too_large")


def is_skipped(record: dict) -> bool:
    return record.get("status") in SKIPPED_STATUSES


def speedup(record: dict, baseline: str) -> float | None:
    """The record's measured speedup over `baseline` ("eager" or "inductor"), or None."""
    value = record.get(BASELINES[baseline])
    if value is None or not record.get("correct"):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 and math.isfinite(value) else None


def interval(record: dict, baseline: str) -> list[float] | None:
    """The record's [low, high] for `baseline`, or None (no interval, or no measured speedup)."""
    value = record.get(INTERVALS[baseline])
    if speedup(record, baseline) is None or not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    try:
        low, high = float(value[0]), float(value[1])
    except (TypeError, ValueError):
        return None
    return [low, high] if math.isfinite(low) and math.isfinite(high) else None


def speedup_low(record: dict, baseline: str) -> float | None:
    """What fast_p decides on: the interval's low end, else the point estimate, else None."""
    point = speedup(record, baseline)
    if point is None:
        return None
    bounds = interval(record, baseline)
    return bounds[0] if bounds is not None else point


def fast_p(records: list[dict], baseline: str, p: float, rule: str = "low") -> float | None:
    """Fraction of ALL problems (skipped ones aside) that are correct with a measured speedup
    strictly above p: its interval's lower bound (rule "low", the default; the point estimate
    for a record without an interval), or its point estimate (rule "point")."""
    from kernelagent.harness.stats import beats

    records = [r for r in records if not is_skipped(r)]
    hits = 0
    for r in records:
        point = speedup(r, baseline)
        if point is None:
            continue
        bounds = interval(r, baseline) if rule == "low" else None
        # stats.beats is "low >= target"; fast_p is strictly above p, as KernelBench defines it.
        decided = bounds[0] if bounds is not None else point
        if beats(bounds, point, p) and decided != p:
            hits += 1
    return _rate(hits, len(records))


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples drawn from n is correct), c correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(max_n: int) -> list[int]:
    return sorted({k for k in (1, 5, 10, 25, 100) if k <= max_n} | ({max_n} if max_n else set()))


def pass_at(records: list[dict]) -> dict[str, Any]:
    """pass@k for k in {1, 5, 10, 25, 100} up to the most samples any problem has, and k = that
    maximum. A problem enters pass@k when it has at least k samples; a problem with no
    candidate at all counts as 0 for every k."""
    max_n = max((int(r.get("samples") or 0) for r in records), default=0)
    out: dict[str, Any] = {}
    for k in ks_for(max_n):
        values = []
        for r in records:
            n, c = int(r.get("samples") or 0), int(r.get("correct_samples") or 0)
            if n == 0:
                values.append(0.0)
            elif n >= k:
                values.append(pass_at_k(n, c, k))
        out[str(k)] = {"value": sum(values) / len(values) if values else None, "problems": len(values)}
    return out


def _sum_tokens(records: list[dict]) -> dict[str, int]:
    total = {"prompt": 0, "completion": 0, "total": 0}
    for r in records:
        for k in total:
            total[k] += int((r.get("tokens") or {}).get(k) or 0)
    return total


def compute(records: list[dict], *, with_levels: bool = True) -> dict[str, Any]:
    everything = records
    records = [r for r in everything if not is_skipped(r)]
    n = len(records)
    compiled = sum(1 for r in records if r.get("compiled"))
    correct = sum(1 for r in records if r.get("correct"))
    tokens = _sum_tokens(records)
    cost = sum(float(r.get("cost_usd") or 0.0) for r in records)
    wall = sum(float(r.get("wall_s") or 0.0) for r in records)
    out: dict[str, Any] = {
        "problems": n,
        "compiled": compiled,
        "correct": correct,
        "compile_rate": _rate(compiled, n),
        "correctness_rate": _rate(correct, n),
        "fast_p": {b: {p_label(p): fast_p(records, b, p) for p in THRESHOLDS} for b in BASELINES},
        "fast_p_point": {b: {p_label(p): fast_p(records, b, p, rule="point") for p in THRESHOLDS}
                         for b in BASELINES},
        "fast_p_rule": FAST_P_RULE,
        "point_only": {b: sum(1 for r in records if speedup(r, b) is not None and interval(r, b) is None)
                       for b in BASELINES},
        "geomean_speedup": {b: geomean(s for r in records if (s := speedup(r, b)) is not None)
                            for b in BASELINES},
        "measured": {b: sum(1 for r in records if speedup(r, b) is not None) for b in BASELINES},
        "timings_meaningful": any(r.get("timings_meaningful") for r in records),
        "samples": sum(int(r.get("samples") or 0) for r in records),
        "max_samples": max((int(r.get("samples") or 0) for r in records), default=0),
        "pass_at_k": pass_at(records),
        "tokens": tokens,
        "cost_usd": round(cost, 6),
        "wall_s": round(wall, 3),
        "per_problem": {"tokens": tokens["total"] / n if n else None,
                        "cost_usd": cost / n if n else None,
                        "wall_s": wall / n if n else None},
        "status_counts": _counts(r.get("status") or "?" for r in everything),
        "skipped": [{"key": r.get("key"), "reason": r.get("skip_reason") or r.get("reason") or ""}
                    for r in everything if is_skipped(r)],
    }
    if with_levels:
        levels: dict[str, list[dict]] = {}
        for r in everything:
            levels.setdefault(r.get("level") or "(none)", []).append(r)
        out["by_level"] = {lv: compute(rs, with_levels=False) for lv, rs in sorted(levels.items())}
    return out


def _counts(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return dict(sorted(counts.items()))


def fast_curve(records: list[dict], baseline: str, top: float = 3.0, step: float = 0.05) -> list[tuple[float, float]]:
    """(p, fast_p) for p from 0 to `top` (the plot of fast_p against the threshold)."""
    points = []
    steps = int(round(top / step))
    for i in range(steps + 1):
        p = round(i * step, 6)
        points.append((p, fast_p(records, baseline, p) or 0.0))
    return points

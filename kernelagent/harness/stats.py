"""Confidence intervals for speedups, from timing samples (pure Python, no torch).

A speedup is t_baseline / t_candidate, each a median over its own timed calls. Its interval is a
percentile bootstrap: resample each side's samples with replacement, take the ratio of the
medians, and keep the 2.5th and 97.5th percentiles. The random generator is seeded from the
samples themselves, so the same samples always give the same interval (results stay
reproducible and comparable across runs).

Decisions that must not be fooled by noise (optimize's target, bench's fast_p, verify's gate)
use the LOW end: "faster than Inductor" means the whole interval is above 1.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import random
import struct
import sys
import threading
from typing import Sequence

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95


def quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile of already sorted values, linearly interpolated (NaN when empty)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _clean(samples: Sequence[float]) -> list[float]:
    return [float(x) for x in samples if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]


def _seed(*groups: list[float]) -> int:
    digest = hashlib.sha256()
    for group in groups:
        digest.update(struct.pack(f"<{len(group)}d", *group))
        digest.update(b"|")
    return int.from_bytes(digest.digest()[:8], "little")


def speedup_interval(baseline_ms: Sequence[float], candidate_ms: Sequence[float],
                     level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES,
                     max_samples: int = 400) -> list[float] | None:
    """[low, high] of median(baseline) / median(candidate) at `level`, or None when either side
    has fewer than 3 usable samples. Long sample lists are thinned evenly to `max_samples`
    (the bootstrap's cost grows with their length; the interval hardly changes)."""
    base, cand = _clean(baseline_ms), _clean(candidate_ms)
    if len(base) < 3 or len(cand) < 3:
        return None
    base, cand = _thin(base, max_samples), _thin(cand, max_samples)
    ratios = _bootstrap_ratios(base, cand, resamples)
    tail = (1.0 - level) / 2
    low = ratios[max(0, int(math.floor(tail * resamples)))]
    high = ratios[min(resamples - 1, int(math.ceil((1.0 - tail) * resamples)) - 1)]
    return [low, high]


def prefetch(module: str) -> threading.Thread | None:
    """Import `module` in a daemon thread, unless it is imported already; the thread, or None.
    The caller starts numpy's import as it sends a job (caller/evaluator.py), so a one-shot
    command's interval after the reply (`_bootstrap_ratios`) does not wait for an import that could
    run while the server ran the job. A failed import is left to the import that needs it."""
    if module in sys.modules:
        return None

    def load() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the caller's own import says why, where it needs it
            pass

    thread = threading.Thread(target=load, name=f"prefetch-{module}", daemon=True)
    thread.start()
    return thread


def _bootstrap_ratios(base: list[float], cand: list[float], resamples: int) -> list[float]:
    """`resamples` ratios of the medians of resampled `base` and `cand`, sorted; the generator is
    seeded from the samples. Vectorised with numpy where it is installed (pure Python costs the
    caller's CPU seconds per result: docs/concepts/concurrency.md, "Where an evaluation's time and
    the host's CPU go"), else in pure Python; each way always gives the same interval for the same
    samples."""
    seed = _seed(base, cand)
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        gen = np.random.Generator(np.random.PCG64(seed))
        b = np.asarray(base, dtype=np.float64)
        c = np.asarray(cand, dtype=np.float64)
        mb = np.median(b[gen.integers(0, len(b), size=(resamples, len(b)))], axis=1)
        mc = np.median(c[gen.integers(0, len(c), size=(resamples, len(c)))], axis=1)
        return sorted((mb / mc).tolist())
    rng = random.Random(seed)
    ratios = []
    nb, nc = len(base), len(cand)
    for _ in range(resamples):
        b_ = _median([base[rng.randrange(nb)] for _ in range(nb)])
        c_ = _median([cand[rng.randrange(nc)] for _ in range(nc)])
        ratios.append(b_ / c_)
    ratios.sort()
    return ratios


def trusted_speedup_interval(baseline_ms: Sequence[float], candidate_ms: Sequence[float],
                             server_segments_ms: Sequence[float], source: str, speedup: float,
                             min_segments: int = 4) -> list[float] | None:
    """The speedup's interval as far as the server's own clock backs it (issue 24, class 2). The
    candidate's samples may narrow what the server measured, never replace it: with enough
    server segments the interval spans both the one from the samples and the one from the
    server's per-segment times; from the server's numbers alone (`source` "server") it is the
    segments' own, or a point where there are too few."""
    segments = _clean(server_segments_ms)
    server = speedup_interval(baseline_ms, segments) if len(segments) >= min_segments else None
    if source == "server":
        return server or point_interval(speedup)
    claimed = speedup_interval(baseline_ms, candidate_ms)
    if claimed is None or server is None:
        return claimed
    return [min(claimed[0], server[0]), max(claimed[1], server[1])]


def point_interval(value: float) -> list[float]:
    """The degenerate interval of a number with no samples behind it (the server's clock)."""
    return [value, value]


def _thin(values: list[float], limit: int) -> list[float]:
    if len(values) <= limit:
        return values
    step = len(values) / limit
    return [values[int(i * step)] for i in range(limit)]


def beats(interval: Sequence[float] | None, point: float | None, target: float) -> bool:
    """The decision rule: True when the speedup is above `target` with confidence, i.e. the
    interval's low end is at least `target`. Without an interval, the point estimate decides."""
    if interval is not None and len(interval) == 2:
        return interval[0] >= target
    return point is not None and point >= target

"""The derived check sets (no torch): variants of a problem's non-pinned shape constants, by the
rules of the package's docstring. The caller validates each one by running the reference.

With a `random.Random` (the harness passes one seeded from each evaluation's secret, never from
the source), every variant keeps its purpose (smaller and ragged, a little larger, skewed,
divisible, the batch alone) but its values are drawn within a band, so the shapes checked cannot
be computed offline from the problem's source (issue 54, class 4). Without one, the rules give
the same sets for the same source (the fixed values below)."""

from __future__ import annotations

import math
import random

from kernelagent.harness import literal_shapes
from kernelagent.harness.derive.source import (Module, Value, pinned_constants, sequence_constants, shape_names,
                                              size_constants)

# The skewed sets' ratios, one cycle per set: slot i shrinks by cycle[i % 3], so neighbouring
# dims change their ratio.
_RATIO_CYCLES = ((3 / 4, 5 / 8, 7 / 8), (5 / 8, 7 / 8, 3 / 4), (7 / 8, 3 / 4, 5 / 8), (9 / 16, 13 / 16, 11 / 16))

def _odd(v: int) -> int:
    return v if v % 2 else v - 1 if v > 1 else 1


def _half_odd(v: int) -> int:
    return max(3, (v // 2) | 1)


def _skew(v: int, ratio: float, avoid: set[int]) -> int:
    cands = [_odd(max(3, math.floor(v * ratio))), _odd(v - 2), v - 1, v + 1]
    for c in cands:
        if c >= 3 and c != v and c not in avoid and (c <= v or v < 4):
            return c
    return v


def _grow(v: int, i: int) -> int:
    """v grown by a small step that differs by slot (2, 4, 6, cycled), made odd: always larger
    than v, and two dims that were equal (M == N) no longer are."""
    return (v + 2 + 2 * (i % 3)) | 1


def _pow2_step(v: int) -> int:
    k = 1
    while v % (k * 2) == 0 and k * 2 <= v // 4:
        k *= 2
    return max(1, v - k) if v - k >= 3 else v + k


def _odd_in(lo: int, hi: int, rng: random.Random, avoid: set[int]) -> int | None:
    """An odd value in [lo, hi] (lo >= 3) other than those in `avoid`, drawn; None if there is none."""
    choices = [c for c in range(lo | 1, hi + 1, 2) if c not in avoid] if hi - lo < 64 else None
    if choices is not None:
        return rng.choice(choices) if choices else None
    for _ in range(16):
        c = rng.randrange(lo | 1, hi + 1, 2)
        if c not in avoid:
            return c
    return None


class _Draw:
    """The drawn counterparts of the fixed rules: one value per distinct main value (dims that were
    equal stay equal, as with the fixed rules), except the grown set, which draws per slot."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def each(self, values: list[int], pick) -> list[int]:
        drawn: dict[int, int] = {}
        return [drawn.setdefault(v, pick(v)) for v in values]

    def half(self, v: int) -> int:
        """Smaller and odd: between a quarter and three quarters of v (the fixed rule: a half)."""
        if v <= 4:
            return _half_odd(v)
        got = _odd_in(max(3, v // 4), max(3, (3 * v) // 4), self.rng, {v})
        return got if got is not None else _half_odd(v)

    def grown(self, values: list[int]) -> list[int]:
        """Each slot grown by its own even step, made odd: always larger, and slots that were equal
        get different steps. The step is at most max(6, v/64) (the fixed rule: 2, 4 or 6): under 2% more
        per large dim."""
        out = list(values)
        for v in set(values):
            where = [i for i, x in enumerate(values) if x == v]
            top = max(3, v // 128, len(where))
            for i, step in zip(where, self.rng.sample(range(2, 2 * top + 1, 2), len(where))):
                out[i] = (v + step) | 1
        return out

    def skew(self, v: int, avoid: int) -> int:
        """A ratio drawn in [9/16, 15/16], made odd, other than the smaller set's value."""
        got = _skew(v, self.rng.uniform(9 / 16, 15 / 16), {avoid})
        return got

    def pow2(self, v: int) -> int:
        """v less one to three times the power of two that _pow2_step uses: divisibility kept."""
        k = 1
        while v % (k * 2) == 0 and k * 2 <= v // 4:
            k *= 2
        options = [v - m * k for m in (1, 2, 3) if v - m * k >= max(3, v // 4)]
        return self.rng.choice(options) if options else _pow2_step(v)


def derive_check_variants(source: str, n: int = 2, rng: random.Random | None = None) -> list[dict[str, Value]]:
    """Up to n override sets for the non-pinned shape constants (rules in the module doc), and for
    get_inputs()'s free shape literals (literal_shapes.lift; derive.apply lifts them the same way).
    With `rng`, the values of each set are drawn within its rule's band (the module doc); without,
    the fixed rules. The caller must validate each one by running the reference and drop those
    that fail."""
    source = literal_shapes.lift(source)
    scal = size_constants(source)
    seqs = sequence_constants(source)
    vary = shape_names(source) - pinned_constants(source)
    # Slots in source order: (name, index in sequence or None, value).
    slots: list[tuple[str, int | None, int]] = []
    for name, v in scal.items():
        if name in vary and v >= 3:
            slots.append((name, None, v))
    for name, vals in seqs.items():
        if name in vary:
            slots.extend((name, i, v) for i, v in enumerate(vals) if v >= 3)
    if not slots:
        return []
    m = Module(source)

    def build(values: list[int]) -> dict[str, Value]:
        out: dict[str, Value] = {}
        for (name, idx, v), nv in zip(slots, values):
            if idx is None:
                if nv != v:
                    out[name] = nv
            else:
                cur = list(out.get(name, seqs[name]))
                cur[idx] = nv
                out[name] = tuple(cur) if m.seq_is_tuple(name) else cur
        return {k: v for k, v in out.items() if v != scal.get(k, seqs.get(k))
                and not (isinstance(v, (list, tuple)) and tuple(v) == seqs.get(k))}

    values = [v for _, _, v in slots]
    draw = _Draw(rng) if rng is not None else None
    half = draw.each(values, draw.half) if draw else [_half_odd(v) for v in values]
    leading = m.leading_names()
    # Set 2 grows every dim a little, each by its own step (odd): a grid or a mask sized for
    # the main shape leaves the extra rows unwritten. The smaller sets alone could not say so:
    # such a kernel writes past the end of their outputs, which on a GPU (and often on the CPU)
    # fails nothing, and its first rows are right.
    grown = draw.grown(values) if draw else [_grow(v, i) for i, v in enumerate(values)]
    gens = [half, grown]
    for cycle in _RATIO_CYCLES:
        if draw:
            skewed = dict(zip(values, half))
            gens.append(draw.each(values, lambda v: draw.skew(v, skewed[v])))
        else:
            gens.append([_skew(v, cycle[i % len(cycle)], {h}) for i, (v, h) in enumerate(zip(values, half))])
        if len(gens) == 3:
            gens.append(draw.each(values, draw.pow2) if draw else [_pow2_step(v) for v in values])
            # The batch alone: the last resort when the model ties its other dims together.
            batch = draw.each(values, draw.half) if draw else [_half_odd(v) for v in values]
            gens.append([b if idx is None and name in leading else v
                         for (name, idx, v), b in zip(slots, batch)])
    variants: list[dict[str, Value]] = []
    for values in gens:
        ov = build(values)
        if ov and ov not in variants:
            variants.append(ov)
        if len(variants) >= n:
            break
    return variants

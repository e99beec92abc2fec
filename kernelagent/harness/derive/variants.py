"""The derived check sets (no torch): variants of a problem's non-pinned shape constants, by the
rules of the package's docstring. The caller validates each one by running the reference."""

from __future__ import annotations

import ast
import math

from kernelagent.harness import literal_shapes
from kernelagent.harness.derive.source import (_RATIO_CYCLES, Value, _Module, _names_in, _seq_is_tuple, pinned_constants,
                                              sequence_constants, shape_names, size_constants)

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


def derive_check_variants(source: str, n: int = 2) -> list[dict[str, Value]]:
    """Up to n override sets for the non-pinned shape constants (rules in the module doc), and for
    get_inputs()'s free shape literals (literal_shapes.lift; derive.apply lifts them the same way).
    The caller must validate each one by running the reference and drop those that fail."""
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

    def build(values: list[int]) -> dict[str, Value]:
        out: dict[str, Value] = {}
        for (name, idx, v), nv in zip(slots, values):
            if idx is None:
                if nv != v:
                    out[name] = nv
            else:
                cur = list(out.get(name, seqs[name]))
                cur[idx] = nv
                out[name] = tuple(cur) if _seq_is_tuple(_Module(source), name) else cur
        return {k: v for k, v in out.items() if v != scal.get(k, seqs.get(k))
                and not (isinstance(v, (list, tuple)) and tuple(v) == seqs.get(k))}

    half = [_half_odd(v) for _, _, v in slots]
    m = _Module(source)
    first, rest = set(), set()
    for exprs in m.factory_shapes():
        for i, e in enumerate(exprs):
            (first if i == 0 and not isinstance(e, (ast.Tuple, ast.List, ast.Starred)) else rest).update(_names_in(e))
    leading = first - rest
    # Set 2 grows every dim a little, each by its own step (odd): a grid or a mask sized for
    # the main shape leaves the extra rows unwritten. The smaller sets alone could not say so:
    # such a kernel writes past the end of their outputs, which on a GPU (and often on the CPU)
    # fails nothing, and its first rows are right.
    grown = [_grow(v, i) for i, (_, _, v) in enumerate(slots)]
    gens = [half, grown]
    for cycle in _RATIO_CYCLES:
        gens.append([_skew(v, cycle[i % len(cycle)], {h}) for i, ((_, _, v), h) in enumerate(zip(slots, half))])
        if len(gens) == 3:
            gens.append([_pow2_step(v) for _, _, v in slots])
            # The batch alone: the last resort when the model ties its other dims together.
            gens.append([_half_odd(v) if idx is None and name in leading else v for name, idx, v in slots])
    variants: list[dict[str, Value]] = []
    for values in gens:
        ov = build(values)
        if ov and ov not in variants:
            variants.append(ov)
        if len(variants) >= n:
            break
    return variants

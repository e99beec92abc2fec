"""Smoke sizes (no torch): the candidates for small inputs a CPU evaluation can afford, in order of
preference (the package's docstring). pick_smoke, which runs them, is in measure.py."""

from __future__ import annotations

import math

from kernelagent.harness.derive.source import (SMOKE_FLOOR, Module, Value, input_shapes, is_divisor_like,
                                              sequence_constants, shapes_of, size_constants)

def _smoke_values(slots: list[tuple[str, int | None, int]], cap: int) -> list[int]:
    """min(v, cap) per slot, keeping divisibility by group-like constants (module doc)."""
    order = sorted(range(len(slots)), key=lambda i: (slots[i][2], i))
    new: list[int] = [0] * len(slots)
    for i in order:
        name, _, v = slots[i]
        if v <= cap:
            new[i] = v
            continue
        d = 1
        for j in order:
            nj, _, vj = slots[j]
            if new[j] and j != i and vj < v and vj > 1 and v % vj == 0 and is_divisor_like(nj):
                d = math.lcm(d, new[j])
        m = max(d, (cap // d) * d)
        if d == 1 and m % 2 == 0 and m > 1:
            m -= 1  # odd when it costs at most 1: ragged tails in smoke runs too
        new[i] = min(m, v)
    return new


def _pow2_values(slots: list[tuple[str, int | None, int]], k: int) -> list[int]:
    """Every slot above SMOKE_FLOOR divided by 2**k, never below min(v, SMOKE_FLOOR), then rounded
    up to a multiple of gcd(v, 8) and of every group-like constant's new value that divided v
    (models assert channels % 4, split channels into groups and heads)."""
    new = [v if v <= SMOKE_FLOOR else max(SMOKE_FLOOR, v >> k) for _, _, v in slots]
    order = sorted(range(len(slots)), key=lambda i: (slots[i][2], i))
    for i in order:
        v = slots[i][2]
        if new[i] == v:
            continue
        d = math.gcd(v, 8)
        for j in order:
            nj, _, vj = slots[j]
            if j != i and 1 < vj < v and v % vj == 0 and is_divisor_like(nj):
                d = math.lcm(d, new[j])
        new[i] = min(v, -(-new[i] // d) * d)
    return new


def _leading_values(slots: list[tuple[str, int | None, int]], leading: set[str]) -> list[int]:
    """Only constants used solely as the leading (batch) dim shrink, to 2."""
    return [min(v, 2) if idx is None and name in leading else v for name, idx, v in slots]


def smoke_candidates(source: str, target_elements: int = 1 << 16) -> list[dict[str, Value]]:
    """Smoke override sets in order of preference (rules in the module doc): first the common
    power-of-two divisor (keeps ratios, equalities and the divisibility between sizes that the
    model may rely on), then the common cap (odd sizes, all large dims about equal), then the
    batch only (for models whose construction fixes the other sizes). All but the last shrink
    pinned constants too. Those whose static estimate meets target_elements come first.
    Deduplicated; [{}] when there is nothing to shrink."""
    m = Module(source)
    scal = size_constants(source)
    seqs = sequence_constants(source)
    slots: list[tuple[str, int | None, int]] = [(n, None, v) for n, v in scal.items()]
    for name, vals in seqs.items():
        slots.extend((name, i, v) for i, v in enumerate(vals))
    if not slots:
        return [{}]
    is_tuple = {name: m.seq_is_tuple(name) for name in seqs}

    def to_overrides(values: list[int]) -> dict[str, Value]:
        out: dict[str, Value] = {}
        seq_new = {name: list(vals) for name, vals in seqs.items()}
        for (name, idx, v), nv in zip(slots, values):
            if idx is None:
                if nv != v:
                    out[name] = nv
            else:
                seq_new[name][idx] = nv
        for name, vals in seq_new.items():
            if tuple(vals) != seqs[name]:
                out[name] = tuple(vals) if is_tuple[name] else vals
        return out

    shapes_exprs = m.factory_shapes()

    def biggest(values: list[int]) -> int | None:
        # A shape read off another tensor (x.shape: None) is skipped: it follows that tensor.
        shapes = shapes_of(shapes_exprs, m.env(to_overrides(values)))
        known = [math.prod(shape) for shape in shapes if shape is not None]
        return max(known) if known else None

    def fits(values: list[int]) -> bool:
        b = biggest(values)
        return b is not None and b <= target_elements

    hi = max(v for _, _, v in slots)
    # 1. common power-of-two divisor: the smallest k that fits (or the largest useful k).
    kmax = max(0, hi.bit_length())
    k = next((k for k in range(kmax + 1) if fits(_pow2_values(slots, k))), kmax)
    pow2 = to_overrides(_pow2_values(slots, k))
    # 2. common cap: the largest cap >= SMOKE_FLOOR that fits (binary search; the floor if none).
    if biggest(_smoke_values(slots, hi)) is None:  # shapes not statically known: a 2-D budget
        cap = max(SMOKE_FLOOR, math.isqrt(target_elements))
    elif hi <= SMOKE_FLOOR or fits(_smoke_values(slots, hi)):
        cap = max(hi, SMOKE_FLOOR)
    elif not fits(_smoke_values(slots, SMOKE_FLOOR)):
        cap = SMOKE_FLOOR
    else:
        lo, up = SMOKE_FLOOR, hi  # invariant: lo fits, up does not
        while up - lo > 1:
            mid = (lo + up) // 2
            lo, up = (mid, up) if fits(_smoke_values(slots, mid)) else (lo, mid)
        cap = lo
    capped = to_overrides(_smoke_values(slots, cap))
    # 3. batch only: for models whose construction fixes the other sizes (an image size default).
    batch = to_overrides(_leading_values(slots, m.leading_names()))
    out: list[dict[str, Value]] = []
    for ov in (pow2, capped, batch):
        if ov not in out:
            out.append(ov)
    # Those that meet the target statically first (stable): the preference order holds among them.
    return sorted(out, key=lambda ov: 0 if (lambda b: b is None or b <= target_elements)(
        max((math.prod(sh) for sh in input_shapes(source, ov) or []), default=0)) else 1)


def derive_smoke(source: str, target_elements: int = 1 << 16) -> dict[str, Value]:
    """The preferred smoke override set: smoke_candidates(...)[0] (rule: module doc). Static only:
    use pick_smoke (or validate_smoke) to know that it runs."""
    return smoke_candidates(source, target_elements)[0]

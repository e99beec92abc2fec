"""Derived input sets for problems that bring none (KernelBench): rewrite a problem's module-level
size constants.

KernelBench problem files set their sizes as module-level constants (``batch_size = 4096``,
``N = 2048 * 2``, ``height = width = 128``, ``D, H, W = 16, 32, 32``, ``input_shape = (32768,)``)
that ``get_inputs()`` and ``get_init_inputs()`` read. They have no ``get_extra_inputs()`` (so a
kernel with its shape baked in passes) and no ``get_smoke_inputs()`` (so CPU mode would allocate
the full multi-GB inputs). This module works on the problem's SOURCE TEXT only — it never imports
torch or runs the problem, except in the ``validate_*`` helpers, :func:`meta_estimate` and
:func:`plan_cpu_inputs`, which import torch lazily (the harness calls them in a forked helper or
the reference process, never in its server) — and returns override dicts plus :func:`apply`,
which rewrites the source with them.

Where the harness uses it (server/job.py): on the CPU, :func:`plan_cpu_inputs` picks the sizes a
problem without get_smoke_inputs() runs at ("derived-smoke"), or says it is too large; for a
problem without get_extra_inputs(), :func:`derive_check_variants` gives the derived check sets,
which the reference validates before they are checked.

Vocabulary and rules (all deterministic; the same source always gives the same answer):

* **Size constant** (:func:`size_constants`): a module-level name assigned exactly once, from a
  pure integer literal expression (``4096``, ``2048 * 2``, chained or tuple-unpacked targets),
  whose value is a positive int (bools excluded) and whose name is not a hyper-parameter: no
  ``_``-separated token of the name starts with one of :data:`HYPER_TOKENS` (kernel, stride, pad,
  dilation, pool, scale, factor, ...). Names bound to other names (``groups = in_channels``) are
  not constants: they follow their source. **Sequence constants** (:func:`sequence_constants`)
  are the same for a tuple/list of positive int literals (``input_shape = (32768,)``,
  ``layer_sizes = [16384, 16384]``); overrides give them a tuple/list of the same kind.
* **Shape names**: constants that reach a shape position of a tensor factory call in
  ``get_inputs()`` (``torch.rand/randn/zeros/ones/empty(*dims)``, the ``size`` of
  ``torch.randint/full``), directly or through other module-level names.
* **Pinned** (:func:`pinned_constants`): constants read by ``get_init_inputs()`` or by any class or
  function other than ``get_inputs`` (the model's construction may read globals), directly or
  through other module-level names. Changing one changes the model, so check variants never do.
* **Check variants** (:func:`derive_check_variants`): only non-pinned shape names with a value >= 3
  change (1 and 2 are usually broadcast dims or axes). Variant 1 halves each one and makes it odd
  (``max(3, (v // 2) | 1)``): smaller, ragged tails. Variant 2 grows each a little, by a step
  that cycles over 2, 4, 6 in source order, and makes it odd: larger than the main set, so a
  grid or mask sized for the main shape leaves elements unwritten (on the smaller sets such a
  kernel writes past its outputs' end, which often fails nothing), and dims that were equal or
  in a fixed ratio no longer are (a kernel that assumes M == N fails).
  Variant 3 (asked for with n >= 3) scales each by a ratio that cycles over 3/4, 5/8, 7/8 and
  makes it odd. Variant 4 keeps divisibility: ``v - 2**k`` with 2**k the largest power of two
  dividing v that is <= v/4 (a fallback when odd sizes break a divisibility the problem needs).
  Variant 5 halves (odd) only the constants used solely as the leading (batch) dim, for models
  that tie their other dims together. Further variants cycle the ratios differently. Every
  variant differs from the main set; only variant 2 is larger than it (by a few elements per
  dim: about the main set's bytes). If a problem has nothing to vary the list is empty. **The caller must
  validate** each variant by running the reference on it (with the main set's init inputs) and
  drop those that fail: these rules do not know every constraint a model has
  (:func:`validate_variant` does it in-process).
* **Smoke** (:func:`smoke_candidates`, :func:`derive_smoke` = the first, :func:`pick_smoke` = the
  first that runs). A size slot is a scalar size constant or an element of a sequence constant,
  pinned ones included; the budget is ``target_elements`` per tensor that ``get_inputs()`` builds,
  estimated statically from the shapes. Three candidates, in this order:
  1. *common power of two*: every slot above :data:`SMOKE_FLOOR` is divided by the same ``2**k``
     (smallest k that meets the budget), never below the floor, then rounded up to a multiple of
     ``gcd(v, 8)`` and of the new value of every group-like constant (a name token starting with
     group/head/cluster/patch/window) that divided it. Ratios, equalities (a LayerNorm over
     ``out_channels`` applied to ``2 * W``) and divisibility (``channels % num_groups``,
     ``% 4`` asserts) survive.
  2. *common cap*: every slot becomes ``min(v, cap)`` with the largest cap >= SMOKE_FLOOR that
     meets the budget (the floor when none does), a multiple of the group-like divisors as above,
     else odd when that costs 1. Small dims stay; all large dims come down to about the same size,
     which keeps deep pooling stacks alive.
  3. *batch only*: constants used solely as the leading dim of the inputs become ``min(v, 2)``,
     for models whose construction fixes the other sizes (an image size default).
  Candidates that meet the budget statically come first (stable). Ranks never change. Literal
  dims in ``get_inputs()`` (``224``) cannot shrink, so a budget may be unreachable.
  :func:`validate_smoke` runs one candidate in-process and says why it fails, if it does.

:func:`apply` rewrites only the assignments it has to, through the AST's byte offsets, and keeps
every other byte; a chained assignment whose names get different values is split into
``a = 1; b = 2`` on the same line.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence

from kernelagent.harness import literal_shapes

__all__ = [
    "HYPER_TOKENS", "SMOKE_FLOOR", "size_constants", "sequence_constants", "pinned_constants",
    "shape_names", "input_shapes", "derive_check_variants", "smoke_candidates", "derive_smoke",
    "pick_smoke", "apply", "validate_smoke", "validate_variant", "meta_estimate", "plan_cpu_inputs",
    "available_memory", "describe_overrides", "SMALL_MAIN_BYTES",
]

# Name tokens of hyper-parameters that must keep their values (they are not sizes).
HYPER_TOKENS = ("kernel", "stride", "pad", "dilation", "pool", "scale", "scaling", "factor", "divisor",
                "ratio", "axis", "window", "patch", "eps", "min", "negative", "slope")
# Name tokens of constants that other sizes must stay divisible by.
_DIVISOR_TOKENS = ("group", "head", "cluster", "patch", "window")
# On the CPU, a problem whose inputs and weights (estimated on the meta device) stay within this
# runs at its own sizes; a larger one runs on derived smoke sizes (plan_cpu_inputs).
SMALL_MAIN_BYTES = 16 << 20
# Elements per input tensor that plan_cpu_inputs aims the smoke sizes at: small enough that a
# kernel under the Triton interpreter (one Python-level program at a time) runs in seconds.
SMOKE_TARGET_ELEMENTS = 1 << 12
SMOKE_FLOOR = 4  # smallest cap: keeps BatchNorm batches > 1 and 3x3 kernels inside their inputs
_RATIO_CYCLES = ((3 / 4, 5 / 8, 7 / 8), (5 / 8, 7 / 8, 3 / 4), (7 / 8, 3 / 4, 5 / 8), (9 / 16, 13 / 16, 11 / 16))

Value = int | tuple | list


class _Unknown(Exception):
    """An expression this evaluator does not follow (a call, an attribute, a local)."""


def _tokens(name: str) -> list[str]:
    return [t for t in name.lower().split("_") if t]


def _is_hyper(name: str) -> bool:
    toks = _tokens(name)
    return any(t.startswith(h) for t in toks for h in HYPER_TOKENS) or name.lower() == "min"


def _is_divisor_like(name: str) -> bool:
    return any(t.startswith(d) for t in _tokens(name) for d in _DIVISOR_TOKENS)


def _eval(node: ast.AST, env: Mapping[str, object]):
    """Evaluate the small expression language of size constants; raise _Unknown otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)) or (
            isinstance(node, ast.Constant) and node.value is None):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _Unknown(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b, ast.Div: lambda: a / b, ast.Mod: lambda: a % b,
               ast.Pow: lambda: a ** b if isinstance(b, int) and abs(b) < 64 else _raise()}
        fn = ops.get(type(node.op))
        if fn is None:
            raise _Unknown("operator")
        try:
            return fn()
        except (TypeError, ZeroDivisionError, OverflowError) as e:
            raise _Unknown(str(e)) from None
    if isinstance(node, (ast.Tuple, ast.List)):
        out: list = []
        for e in node.elts:
            if isinstance(e, ast.Starred):
                v = _eval(e.value, env)
                if not isinstance(v, (tuple, list)):
                    raise _Unknown("starred")
                out.extend(v)
            else:
                out.append(_eval(e, env))
        return tuple(out) if isinstance(node, ast.Tuple) else out
    raise _Unknown(type(node).__name__)


def _raise():
    raise _Unknown("power")


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _pure_literal(node: ast.AST) -> bool:
    """Only literals and arithmetic: no names, so the value is the constant's own."""
    return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.List, ast.Load,
                              ast.operator, ast.unaryop)) for n in ast.walk(node))


class _Module:
    """What this module needs to know about one problem source."""

    def __init__(self, source: str):
        self.source = source
        self.tree = ast.parse(source)
        self.assigns: list[ast.Assign] = [n for n in self.tree.body if isinstance(n, ast.Assign)]
        counts: dict[str, int] = {}
        # name -> (statement, target index, element index or None, value node)
        self.binding: dict[str, tuple[ast.Assign, ast.AST]] = {}
        self.deps: dict[str, set[str]] = {}
        for stmt in self.tree.body:
            targets: list[ast.AST] = []
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                targets = [stmt.target]
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                counts[stmt.name] = counts.get(stmt.name, 0) + 2  # a def is never a constant
                continue
            for t in targets:
                for name, value in self._unpack(t, getattr(stmt, "value", None)):
                    counts[name] = counts.get(name, 0) + 1
                    if value is not None and isinstance(stmt, ast.Assign):
                        self.binding[name] = (stmt, value)
                        self.deps[name] = _names_in(value)
        self.single = {n for n, c in counts.items() if c == 1 and n in self.binding}
        self.funcs = {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    @staticmethod
    def _unpack(target: ast.AST, value: ast.AST | None):
        if isinstance(target, ast.Name):
            yield target.id, value
        elif isinstance(target, (ast.Tuple, ast.List)):
            vals = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) \
                and not any(isinstance(e, ast.Starred) for e in value.elts) else None
            for i, e in enumerate(target.elts):
                if isinstance(e, ast.Name):
                    yield e.id, (vals[i] if vals is not None else None)

    def env(self, overrides: Mapping[str, Value] | None = None) -> dict[str, object]:
        """Module-level values, in statement order, with overrides in place of the constants."""
        overrides = overrides or {}
        env: dict[str, object] = {}
        for stmt in self.tree.body:
            if not isinstance(stmt, ast.Assign):
                continue
            for t in stmt.targets:
                for name, value in self._unpack(t, stmt.value):
                    if name in overrides and name in self.single:
                        env[name] = overrides[name]
                        continue
                    if value is None:
                        env.pop(name, None)
                        continue
                    try:
                        env[name] = _eval(value, env)
                    except _Unknown:
                        env.pop(name, None)
        return env

    def closure(self, names: set[str]) -> set[str]:
        """names plus the module-level names their values read, transitively."""
        seen: set[str] = set()
        todo = list(names)
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo.extend(self.deps.get(n, ()))
        return seen

    def factory_shapes(self) -> list[list[ast.AST]]:
        """Shape expressions (one list per tensor factory call) in get_inputs()."""
        fn = self.funcs.get("get_inputs")
        if fn is None:
            return []
        return literal_shapes.factory_shape_exprs(fn)


def _shape_of(exprs: list[ast.AST], env: Mapping[str, object]) -> tuple[int, ...]:
    dims: list = []
    for e in exprs:
        if isinstance(e, ast.Starred):
            v = _eval(e.value, env)
            if not isinstance(v, (tuple, list)):
                raise _Unknown("starred")
            dims.extend(v)
        else:
            v = _eval(e, env)
            dims.extend(v) if isinstance(v, (tuple, list)) else dims.append(v)
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise _Unknown("dims")
    return tuple(dims)


# ---------------------------------------------------------------- public queries

def size_constants(source: str) -> dict[str, int]:
    """Module-level scalar size constants, name -> value, in source order (rule: module doc)."""
    m = _Module(source)
    out: dict[str, int] = {}
    for stmt in m.assigns:
        for t in stmt.targets:
            for name, value in m._unpack(t, stmt.value):
                if name not in m.single or value is None or _is_hyper(name) or not _pure_literal(value):
                    continue
                try:
                    v = _eval(value, {})
                except _Unknown:
                    continue
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    out[name] = v
    return out


def sequence_constants(source: str) -> dict[str, tuple[int, ...]]:
    """Module-level tuples/lists of positive int literals that look like sizes (``input_shape``,
    ``layer_sizes``), name -> values (as a tuple)."""
    m = _Module(source)
    out: dict[str, tuple[int, ...]] = {}
    for stmt in m.assigns:
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            continue
        name = stmt.targets[0].id
        # A tuple/list display, or literal arithmetic that makes one ([1024] * 16).
        if name not in m.single or _is_hyper(name) or not isinstance(stmt.value, (ast.Tuple, ast.List, ast.BinOp)):
            continue
        if not _pure_literal(stmt.value):
            continue
        try:
            v = _eval(stmt.value, {})
        except _Unknown:
            continue
        if isinstance(v, (tuple, list)) and v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                      for x in v):
            out[name] = tuple(v)
    return out


def _seq_is_tuple(m: "_Module", name: str) -> bool:
    node = m.binding[name][1]
    if isinstance(node, (ast.Tuple, ast.List)):
        return isinstance(node, ast.Tuple)
    try:
        return isinstance(_eval(node, {}), tuple)
    except _Unknown:
        return False


def pinned_constants(source: str) -> set[str]:
    """Size and sequence constants that fix the model's construction: read by get_init_inputs()
    or by any class/function other than get_inputs, directly or through module-level names."""
    m = _Module(source)
    used: set[str] = set()
    for node in m.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name != "get_inputs":
            used |= _names_in(node)
    consts = set(size_constants(source)) | set(sequence_constants(source))
    return m.closure(used) & consts


def shape_names(source: str) -> set[str]:
    """Size and sequence constants that reach a shape position of a tensor built by get_inputs()."""
    m = _Module(source)
    used: set[str] = set()
    for exprs in m.factory_shapes():
        for e in exprs:
            used |= _names_in(e)
    consts = set(size_constants(source)) | set(sequence_constants(source))
    return m.closure(used) & consts


def input_shapes(source: str, overrides: Mapping[str, Value] | None = None) -> list[tuple[int, ...]] | None:
    """Static estimate of the shapes of the tensors get_inputs() builds (every factory call, in
    order), with overrides applied; None when some shape cannot be followed statically."""
    if literal_shapes.has_lifted(overrides):
        source = literal_shapes.lift(source)
    m = _Module(source)
    env = m.env(overrides)
    out = []
    for exprs in m.factory_shapes():
        try:
            out.append(_shape_of(exprs, env))
        except _Unknown:
            return None
    return out


# ---------------------------------------------------------------- check variants

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


# ---------------------------------------------------------------- smoke

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
            if new[j] and j != i and vj < v and vj > 1 and v % vj == 0 and _is_divisor_like(nj):
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
            if j != i and 1 < vj < v and v % vj == 0 and _is_divisor_like(nj):
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
    m = _Module(source)
    scal = size_constants(source)
    seqs = sequence_constants(source)
    slots: list[tuple[str, int | None, int]] = [(n, None, v) for n, v in scal.items()]
    for name, vals in seqs.items():
        slots.extend((name, i, v) for i, v in enumerate(vals))
    if not slots:
        return [{}]
    is_tuple = {name: _seq_is_tuple(m, name) for name in seqs}

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
        env = m.env(to_overrides(values))
        best, known = 0, False
        for exprs in shapes_exprs:
            try:  # a shape read off another tensor (x.shape) is skipped: it follows that tensor
                best = max(best, math.prod(_shape_of(exprs, env)))
                known = True
            except _Unknown:
                continue
        return best if known else None

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
    first, rest = set(), set()
    for exprs in shapes_exprs:
        for i, e in enumerate(exprs):
            (first if i == 0 and not isinstance(e, (ast.Tuple, ast.List, ast.Starred)) else rest).update(_names_in(e))
    batch = to_overrides(_leading_values(slots, first - rest))
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


def pick_smoke(source: str, target_elements: int = 1 << 16, *,
               max_elements: int = 1 << 20) -> tuple[dict[str, Value], str | None]:
    """The first smoke candidate that runs in-process (validate_smoke), with None; when none
    does, the first candidate and every candidate's error joined, so the caller can report it.
    Needs torch."""
    cands = smoke_candidates(source, target_elements)
    errors = []
    for ov in cands:
        err = validate_smoke(source, ov, max_elements=max_elements)
        if err is None:
            return ov, None
        errors.append(err)
    return cands[0], "; ".join(f"candidate {i + 1}: {e}" for i, e in enumerate(errors))


# ---------------------------------------------------------------- rewriting

def _literal(v: Value, like: ast.AST | None = None) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, tuple, list)):
        raise ValueError(f"override value {v!r} is not an int or a tuple/list of ints")
    if isinstance(v, int):
        return repr(v)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ValueError(f"override value {v!r} is not an int or a tuple/list of ints")
    as_list = isinstance(v, list) if not isinstance(like, (ast.Tuple, ast.List)) else isinstance(like, ast.List)
    body = ", ".join(map(repr, v))
    if as_list:
        return f"[{body}]"
    return f"({body},)" if len(v) == 1 else f"({body})"


def apply(source: str, overrides: Mapping[str, Value]) -> str:
    """The source with the module-level assignments of the overridden constants rewritten; every
    other byte kept. Raises ValueError for a name that is not a single-assignment constant."""
    if not overrides:
        return source
    if literal_shapes.has_lifted(overrides):
        source = literal_shapes.lift(source)
    m = _Module(source)
    consts = set(size_constants(source)) | set(sequence_constants(source))
    # Any single, literal module-level constant may be overridden (hyper-parameters too, on purpose).
    for name in overrides:
        if name not in m.single or not _pure_literal(m.binding[name][1]):
            raise ValueError(f"{name!r} is not a module-level constant assigned once from a literal")
    del consts
    data = source.encode("utf-8")
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    def off(lineno: int, col: int) -> int:
        return line_starts[lineno - 1] + col

    edits: list[tuple[int, int, str]] = []
    for stmt in m.assigns:
        names = [(n, v) for t in stmt.targets for n, v in m._unpack(t, stmt.value)]
        hit = [n for n, _ in names if n in overrides]
        if not hit:
            continue
        if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            v = stmt.value
            edits.append((off(v.lineno, v.col_offset), off(v.end_lineno, v.end_col_offset),
                          _literal(overrides[hit[0]], v)))
        elif len(stmt.targets) == 1:  # a, b = 1, 2: rewrite the elements
            for name, v in names:
                if name in overrides:
                    edits.append((off(v.lineno, v.col_offset), off(v.end_lineno, v.end_col_offset),
                                  _literal(overrides[name], v)))
        else:  # a = b = 128
            vals = {n: overrides.get(n) for n, _ in names}
            if len({repr(x) for x in vals.values()}) == 1:
                v = stmt.value
                edits.append((off(v.lineno, v.col_offset), off(v.end_lineno, v.end_col_offset),
                              _literal(overrides[hit[0]], v)))
            else:
                orig = data[off(stmt.value.lineno, stmt.value.col_offset):
                            off(stmt.value.end_lineno, stmt.value.end_col_offset)].decode("utf-8")
                text = "; ".join(f"{n} = {_literal(vals[n], stmt.value) if vals[n] is not None else orig}"
                                 for n, _ in names)
                edits.append((off(stmt.lineno, stmt.col_offset), off(stmt.end_lineno, stmt.end_col_offset), text))
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text.encode("utf-8") + data[end:]
    out = data.decode("utf-8")
    compile(out, "<derived>", "exec")  # a rewrite that does not compile is a bug here, not the caller's
    return out


# ---------------------------------------------------------------- in-process validation (needs torch)

def _exec_problem(source: str, name: str = "derived_problem"):
    import types

    mod = types.ModuleType(name)
    mod.__dict__["__file__"] = f"<{name}>"
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    return mod


def _tensors(values) -> list:
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


def validate_smoke(source: str, overrides: Mapping[str, Value] | None = None, *,
                   max_elements: int = 1 << 20, seed: int = 0) -> str | None:
    """Run the smoke-overridden problem in this process (CPU): build Model(*get_init_inputs()),
    run it on get_inputs(). None when it runs and every input tensor has at most max_elements
    elements; otherwise one line saying why not. overrides default to derive_smoke(source).
    The sizes are first estimated on the meta device, so a candidate that would allocate more
    than max_elements per input tensor (or 16x that in weights) is refused without allocating."""
    import torch

    try:
        src = apply(source, derive_smoke(source) if overrides is None else overrides)
    except (ValueError, SyntaxError) as e:
        return f"rewrite failed: {e}"
    try:
        est = meta_estimate(src)
    except Exception:  # noqa: BLE001 - the meta device does not run everything: the static estimate
        shapes = input_shapes(src)
        est = {"largest": max((math.prod(s) for s in shapes), default=0) if shapes is not None else None,
               "param_bytes": 0}
    if est["largest"] is not None and est["largest"] > max_elements:
        return f"an input would have {est['largest']} elements (> {max_elements})"
    if est["param_bytes"] > 64 * max_elements:
        return f"the weights would take {est['param_bytes']} bytes (> {64 * max_elements})"
    try:
        torch.manual_seed(seed)
        mod = _exec_problem(src)
        inputs = list(mod.get_inputs())
        for t in _tensors(inputs):
            if t.numel() > max_elements:
                return f"input of shape {tuple(t.shape)} has {t.numel()} elements (> {max_elements})"
        model = mod.Model(*mod.get_init_inputs())
        with torch.no_grad():
            model(*inputs)
    except Exception as e:  # noqa: BLE001 - any failure of the problem itself is the answer
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
    return None


def validate_variant(source: str, overrides: Mapping[str, Value], *, seed: int = 0) -> str | None:
    """Check one derived check set in-process: get_init_inputs() must return what the original
    returns, the reference must run on the variant's get_inputs(), and the input shapes must
    differ from the main set's. None when all hold; otherwise one line saying which did not."""
    import torch

    try:
        src = apply(source, overrides)
        torch.manual_seed(seed)
        base = _exec_problem(source, "derived_base")
        var = _exec_problem(src, "derived_variant")
        init_a, init_b = list(base.get_init_inputs()), list(var.get_init_inputs())
        if repr(init_a) != repr(init_b):
            return f"init inputs changed: {init_a!r} -> {init_b!r}"
        # Compare shapes statically where possible: the main set's inputs may be many GB.
        main_static, var_static = input_shapes(source), input_shapes(source, overrides)
        inputs = list(var.get_inputs())
        if main_static is not None and var_static is not None:
            main_shapes, shapes = main_static, var_static
        else:
            main_shapes = [tuple(t.shape) for t in _tensors(base.get_inputs())]
            shapes = [tuple(t.shape) for t in _tensors(inputs)]
        if shapes == main_shapes:
            return f"input shapes {shapes} are the main set's"
        model = var.Model(*init_b)
        with torch.no_grad():
            model(*inputs)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
    return None


# ---------------------------------------------------------------- estimates and the CPU plan (need torch)

def meta_estimate(source: str, overrides: Mapping[str, Value] | None = None) -> dict:
    """What one call of the problem holds, without allocating anything: get_inputs() and
    Model(*get_init_inputs()) run under the meta device, and the forward call too where the
    meta device supports its ops. {"input_bytes", "largest" (elements of the largest input
    tensor), "param_bytes", "output_bytes" (None when the forward call did not run on meta)}.
    Raises whatever the problem raises."""
    import torch

    src = apply(source, overrides) if overrides else source
    with torch.device("meta"):
        mod = _exec_problem(src, "derived_meta")
        inputs = list(mod.get_inputs())
        tensors = _tensors(inputs)
        out = {"input_bytes": sum(t.numel() * t.element_size() for t in tensors),
               "largest": max((t.numel() for t in tensors), default=0), "param_bytes": 0, "output_bytes": None}
        try:
            model = mod.Model(*mod.get_init_inputs())
            if isinstance(model, torch.nn.Module):
                out["param_bytes"] = sum(t.numel() * t.element_size()
                                         for t in list(model.parameters()) + list(model.buffers()))
            with torch.no_grad():
                result = model(*inputs)
            outs = _tensors(result if isinstance(result, (list, tuple)) else [result])
            out["output_bytes"] = sum(t.numel() * t.element_size() for t in outs)
        except Exception:  # noqa: BLE001 - an op without a meta kernel: inputs are what matter most
            pass
    return out


def available_memory() -> int | None:
    """Bytes of host memory available now (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _need_bytes(est: dict) -> int:
    """Host memory an evaluation at these sizes needs, roughly: in each of its two processes
    the inputs and a copy, the outputs and a copy (the outputs' size is taken to be the inputs'
    where the meta device could not run the call), and the weights."""
    out = est["output_bytes"] if est.get("output_bytes") is not None else est["input_bytes"]
    return 2 * (2 * est["input_bytes"] + 2 * out + est["param_bytes"])


def plan_cpu_inputs(source: str, *, available_bytes: int | None = None, target_elements: int = SMOKE_TARGET_ELEMENTS,
                    max_elements: int = 1 << 20, small_bytes: int = SMALL_MAIN_BYTES) -> dict:
    """Which sizes a CPU evaluation of a problem without get_smoke_inputs() runs at. Runs problem
    code (meta-device estimates, then smoke candidates for real at their small sizes), so call it
    in a process of its own. Returns a JSON-able dict:

    * {"input_set": "main", ...}: the main inputs and weights are small (<= small_bytes), or no
      smoke candidate runs but the main sizes fit available_bytes;
    * {"input_set": "derived-smoke", "overrides": {...}}: the first smoke candidate
      (smoke_candidates) that runs, checked on the meta device first so nothing big is allocated;
    * {"input_set": "too_large", "needed_bytes", "available_bytes"}: none runs and the main sizes
      do not fit.

    Every answer carries "main_bytes" (inputs + weights of the main sizes, None when unknown),
    "needed_bytes" (None when unknown) and "note" (why, in words)."""
    try:
        est = meta_estimate(source)
    except Exception as e:  # noqa: BLE001 - fall back to the static shapes (fp32 assumed)
        shapes = input_shapes(source)
        est = None if shapes is None else {"input_bytes": 4 * sum(math.prod(s) for s in shapes),
                                           "largest": max((math.prod(s) for s in shapes), default=0),
                                           "param_bytes": 0, "output_bytes": None}
        meta_error = f"{type(e).__name__}: {e}"[:300]
    else:
        meta_error = ""
    main_bytes = None if est is None else est["input_bytes"] + est["param_bytes"]
    needed = None if est is None else _need_bytes(est)
    plan = {"main_bytes": main_bytes, "needed_bytes": needed, "available_bytes": available_bytes, "note": ""}
    if main_bytes is not None and main_bytes <= small_bytes:
        return {**plan, "input_set": "main", "note": "the main inputs are small enough for the CPU"}
    errors: list[str] = []
    tried: list[dict] = []
    # The smallest budget first; a larger one when none of its candidates runs (a pooling
    # window that the smallest sizes cannot hold, say), up to 16x.
    for target in (target_elements, 4 * target_elements, 16 * target_elements):
        for ov in smoke_candidates(source, target):
            if ov in tried:
                continue
            tried.append(ov)
            if not ov:
                errors.append(f"candidate {len(tried)}: no size constant to shrink")
                continue
            err = validate_smoke(source, ov, max_elements=max_elements)
            if err is None:
                return {**plan, "input_set": "derived-smoke", "overrides": dict(ov),
                        "note": f"derived smoke sizes: {describe_overrides(source, ov)}"}
            errors.append(f"candidate {len(tried)}: {err}")
    why = "; ".join(errors) or "no smoke candidate"
    if meta_error:
        why += f"; the meta-device estimate failed ({meta_error})"
    if needed is not None and available_bytes is not None and needed > available_bytes:
        return {**plan, "input_set": "too_large",
                "note": f"no smoke sizes could be derived ({why})"}
    return {**plan, "input_set": "main", "note": f"no smoke sizes could be derived ({why}); the main sizes are used"}


def describe_overrides(source: str, overrides: Mapping[str, Value]) -> str:
    """'batch_size=2047 (main 4096), dim=196607 (main 393216)': what a set changes, in words."""
    if literal_shapes.has_lifted(overrides):
        source = literal_shapes.lift(source)
    env = _Module(source).env()
    parts = []
    for name, v in overrides.items():
        old = env.get(name)
        val = tuple(v) if isinstance(v, list) else v
        oldv = tuple(old) if isinstance(old, list) else old
        label = f"get_inputs() literal {oldv}" if name.startswith(literal_shapes.PREFIX) else name
        parts.append(f"{label}={val}" + (f" (main {oldv})" if old is not None and label == name else ""))
    return ", ".join(parts)

"""Reading a problem's source (no torch): its size and sequence constants, which of them are pinned
by the model's construction, which reach get_inputs()'s shapes, and the shapes themselves. The
rules are in the package's docstring (kernelagent/harness/derive/__init__.py)."""

from __future__ import annotations

import ast
from collections.abc import Mapping

from kernelagent.harness import literal_shapes
from kernelagent import pyast

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

Value = int | tuple | list


class _Unknown(Exception):
    """An expression this evaluator does not follow (a call, an attribute, a local)."""


def _tokens(name: str) -> list[str]:
    return [t for t in name.lower().split("_") if t]


def _is_hyper(name: str) -> bool:
    toks = _tokens(name)
    return any(t.startswith(h) for t in toks for h in HYPER_TOKENS) or name.lower() == "min"


def is_divisor_like(name: str) -> bool:
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


def pure_literal(node: ast.AST) -> bool:
    """Only literals and arithmetic: no names, so the value is the constant's own."""
    return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.List, ast.Load,
                              ast.operator, ast.unaryop)) for n in ast.walk(node))


class Module:
    """What this module needs to know about one problem source."""

    def __init__(self, source: str):
        self.source = source
        self.tree = pyast.parse(source)
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

    def leading_names(self) -> set[str]:
        """Names read only in the leading (batch) dim of get_inputs()'s shapes, in no other dim."""
        first: set[str] = set()
        rest: set[str] = set()
        for exprs in self.factory_shapes():
            for i, e in enumerate(exprs):
                leading = i == 0 and not isinstance(e, (ast.Tuple, ast.List, ast.Starred))
                (first if leading else rest).update(_names_in(e))
        return first - rest

    def seq_is_tuple(self, name: str) -> bool:
        """Whether the sequence constant `name` is a tuple (else a list): an override keeps its kind."""
        node = self.binding[name][1]
        if isinstance(node, (ast.Tuple, ast.List)):
            return isinstance(node, ast.Tuple)
        try:
            return isinstance(_eval(node, {}), tuple)
        except _Unknown:
            return False


def shapes_of(shapes_exprs: list[list[ast.AST]], env: Mapping[str, object]) -> list[tuple[int, ...] | None]:
    """The shape of each factory call (Module.factory_shapes) under env; None for one that cannot
    be followed statically (a shape read off another tensor, x.shape)."""
    out: list[tuple[int, ...] | None] = []
    for exprs in shapes_exprs:
        try:
            out.append(_shape_of(exprs, env))
        except _Unknown:
            out.append(None)
    return out


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


def size_constants(source: str) -> dict[str, int]:
    """Module-level scalar size constants, name -> value, in source order (rule: module doc)."""
    m = Module(source)
    out: dict[str, int] = {}
    for stmt in m.assigns:
        for t in stmt.targets:
            for name, value in m._unpack(t, stmt.value):
                if name not in m.single or value is None or _is_hyper(name) or not pure_literal(value):
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
    m = Module(source)
    out: dict[str, tuple[int, ...]] = {}
    for stmt in m.assigns:
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            continue
        name = stmt.targets[0].id
        # A tuple/list display, or literal arithmetic that makes one ([1024] * 16).
        if name not in m.single or _is_hyper(name) or not isinstance(stmt.value, (ast.Tuple, ast.List, ast.BinOp)):
            continue
        if not pure_literal(stmt.value):
            continue
        try:
            v = _eval(stmt.value, {})
        except _Unknown:
            continue
        if isinstance(v, (tuple, list)) and v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                      for x in v):
            out[name] = tuple(v)
    return out


def pinned_constants(source: str) -> set[str]:
    """Size and sequence constants that fix the model's construction: read by get_init_inputs()
    or by any class/function other than get_inputs, directly or through module-level names."""
    m = Module(source)
    used: set[str] = set()
    for node in m.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name != "get_inputs":
            used |= _names_in(node)
    consts = set(size_constants(source)) | set(sequence_constants(source))
    return m.closure(used) & consts


def shape_names(source: str) -> set[str]:
    """Size and sequence constants that reach a shape position of a tensor built by get_inputs()."""
    m = Module(source)
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
    m = Module(source)
    shapes = shapes_of(m.factory_shapes(), m.env(overrides))
    return None if None in shapes else shapes

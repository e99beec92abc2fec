"""Writing overrides into a problem's source (no torch): `apply` rewrites only the assignments it
has to, through the AST's byte offsets, and keeps every other byte; `describe_overrides` says what
a set changes, in words."""

from __future__ import annotations

import ast
from collections.abc import Mapping

from kernelagent.harness import literal_shapes
from kernelagent.harness.derive.source import (Module, Value, pure_literal, sequence_constants, size_constants)

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
    m = Module(source)
    consts = set(size_constants(source)) | set(sequence_constants(source))
    # Any single, literal module-level constant may be overridden (hyper-parameters too, on purpose).
    for name in overrides:
        if name not in m.single or not pure_literal(m.binding[name][1]):
            raise ValueError(f"{name!r} is not a module-level constant assigned once from a literal")
    del consts
    # A sequence keeps its kind whatever the override's (JSON, across processes, has lists only).
    overrides = {k: (tuple(v) if m.seq_is_tuple(k) else list(v)) if isinstance(v, (list, tuple)) else v
                 for k, v in overrides.items()}
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


def describe_overrides(source: str, overrides: Mapping[str, Value]) -> str:
    """'batch_size=2047 (main 4096), dim=196607 (main 393216)': what a set changes, in words."""
    if literal_shapes.has_lifted(overrides):
        source = literal_shapes.lift(source)
    env = Module(source).env()
    parts = []
    for name, v in overrides.items():
        old = env.get(name)
        val = tuple(v) if isinstance(v, list) else v
        oldv = tuple(old) if isinstance(old, list) else old
        label = f"get_inputs() literal {oldv}" if name.startswith(literal_shapes.PREFIX) else name
        parts.append(f"{label}={val}" + (f" (main {oldv})" if old is not None and label == name else ""))
    return ", ".join(parts)

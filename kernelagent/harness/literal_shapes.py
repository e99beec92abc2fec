"""Shapes written as literals in get_inputs() (``torch.randn(64, 300)``), lifted into module-level
constants so that derive.py can derive check sets from them as from any size constant.

derive.py varies a problem's module-level size constants. A problem whose get_inputs() writes a
dimension as a literal had only its own shape checked, so a kernel specialised to it passed.
`lift(source)` rewrites each such literal (an int >= 3 in a shape position of a tensor factory
call in get_inputs) into a name, ``_ka_dim_<value>``, assigned once at the end of the file:

- equal literals share one name, so dimensions that must agree (a matmul's inner sizes) change
  together;
- a value that also appears as an int literal anywhere else in the file (the model's
  construction, get_init_inputs, another constant) is left alone: it is likely tied to the model
  (``nn.Conv2d(3, ...)`` and ``torch.rand(n, 3, 224, 224)``), and changing it would only give a set
  the reference rejects;
- the rewrite keeps every other byte and every line number (the names are appended).

The lifted source computes exactly what the original does; derive.derive_check_variants and
derive.apply lift first, and the reference still validates every derived set before it is
checked (a variant the model cannot take is dropped).
"""

from __future__ import annotations

import ast
from kernelagent import pyast

PREFIX = "_ka_dim_"
_FACTORIES = {"rand", "randn", "zeros", "ones", "empty", "randint", "full", "rand_like"}


def factory_shape_exprs(fn: ast.FunctionDef) -> list[list[ast.AST]]:
    """Shape expressions (one list per torch tensor factory call) in `fn`: the `size=` keyword,
    randint's last and full's first argument, a single tuple/list/name argument, or the
    positional dims. The one rule for what is a shape, used here and by derive.py."""
    shapes: list[list[ast.AST]] = []
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"
                and call.func.attr in _FACTORIES):
            continue
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        args = list(call.args)
        attr = call.func.attr
        if "size" in kw:
            shapes.append([kw["size"]])
        elif attr == "randint":
            if args:
                shapes.append([args[-1]])
        elif attr == "full":
            if args:
                shapes.append([args[0]])
        elif attr == "rand_like":
            continue
        elif len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List, ast.Name)):
            shapes.append([args[0]])
        else:
            shapes.append(args)
    return shapes


def _shape_literals(fn: ast.FunctionDef) -> list[ast.Constant]:
    """Int constants >= 3 in shape positions of torch factory calls in `fn`."""
    found: list[ast.Constant] = []
    for shape in factory_shape_exprs(fn):
        for expr in shape:
            items = expr.elts if isinstance(expr, (ast.Tuple, ast.List)) else [expr]
            for item in items:
                if isinstance(item, ast.Constant) and type(item.value) is int and item.value >= 3:
                    found.append(item)
    return found


def lift(source: str) -> str:
    """The source with get_inputs()'s free shape literals lifted into constants (module doc);
    the source unchanged when there are none or it does not parse."""
    try:
        tree = pyast.parse(source)
    except SyntaxError:
        return source
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_inputs"), None)
    if fn is None:
        return source
    literals = _shape_literals(fn)
    if not literals:
        return source
    inside = {id(node) for node in ast.walk(fn)}
    elsewhere = {node.value for node in ast.walk(tree)
                 if id(node) not in inside and isinstance(node, ast.Constant) and type(node.value) is int}
    taken = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    lifted = [node for node in literals if node.value not in elsewhere]
    if not lifted or any(f"{PREFIX}{node.value}" in taken for node in lifted):
        return source  # nothing free to vary, or already lifted
    lines = source.splitlines(keepends=True)
    # Right to left within a line, so earlier columns stay valid (literals never span lines).
    for node in sorted(lifted, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        line = lines[node.lineno - 1]
        start, end = _char_offsets(line, node.col_offset, node.end_col_offset)
        lines[node.lineno - 1] = line[:start] + f"{PREFIX}{node.value}" + line[end:]
    out = "".join(lines)
    if not out.endswith("\n"):
        out += "\n"
    values = sorted({node.value for node in lifted})
    out += "".join(f"{PREFIX}{v} = {v}  # a shape literal of get_inputs(), lifted (harness/literal_shapes.py)\n"
                   for v in values)
    compile(out, "<lifted>", "exec")  # a rewrite that does not compile is a bug here
    return out


def _char_offsets(line: str, start_byte: int, end_byte: int) -> tuple[int, int]:
    """ast's column offsets are UTF-8 byte offsets; the line is text."""
    raw = line.encode("utf-8")
    return len(raw[:start_byte].decode("utf-8")), len(raw[:end_byte].decode("utf-8"))


def has_lifted(overrides: object) -> bool:
    return any(isinstance(name, str) and name.startswith(PREFIX) for name in (overrides or {}))

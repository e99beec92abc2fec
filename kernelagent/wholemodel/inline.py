"""One module's source put inside another's: its module-level names renamed with a prefix (no torch here).

A spliced model (child.py `splice`) holds the original model and each region's kernel in one
file, as code, not as strings run through exec(): the harness then sees the kernels as the
candidate's own (their code objects belong to the candidate's file), Triton reads their source
from that file, and a reader sees every line that runs. Two kernels may both define `_kernel` or
`ModelNew`, and a kernel may import `functional as F` where the model binds `F` to something
else, so every name a kernel binds at module level (functions, classes, assignments, imports
under another name) becomes `<prefix><name>`, and so does every use of it that is not shadowed
by a local of the same name. Imports keep their names where the code before them in the file
binds the name the same way or not at all (`import triton.language as tl` everywhere: Triton's
CPU interpreter recognises `tl.constexpr` by its text); a plain `import torch` binds the same
module object whoever runs it. `from __future__` imports are returned apart (they must open
the file).

Scoping follows Python's: a name bound anywhere in a function (its parameters included), a
lambda or a comprehension is local there unless declared `global`; a class body's names do not
reach the functions defined in it. Names only reached through strings (`globals()["x"]`) are not
followed: such a kernel is refused (`InlineError`), as is one with `from x import *`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from kernelagent import pyast


class InlineError(ValueError):
    """The source cannot be inlined safely (a star import, globals() by name)."""


@dataclass
class Inlined:
    code: str  # the renamed source, `from __future__` imports removed
    futures: list[str]  # the `from __future__ import ...` lines it had
    names: dict[str, str]  # module-level name -> its new name


def bindings(tree: ast.Module) -> dict[str, set[tuple]]:
    """What each name a module binds at its top level is bound to: ("import", module) for
    `import m as name`, ("from", module, attr) for `from module import attr as name`,
    ("plain", top) for `import top.sub` (binds `top`), ("other",) for anything else."""
    out: dict[str, set[tuple]] = {}

    def bind(name: str, key: tuple) -> None:
        out.setdefault(name, set()).add(key)

    def targets(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                bind(sub.id, ("other",))

    def visit(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bind(stmt.name, ("other",))
            elif isinstance(stmt, ast.Import):
                for a in stmt.names:
                    if a.asname:
                        bind(a.asname, ("import", a.name))
                    else:
                        bind(a.name.split(".")[0], ("plain", a.name.split(".")[0]))
            elif isinstance(stmt, ast.ImportFrom):
                if stmt.module == "__future__":
                    continue
                for alias in stmt.names:
                    if alias.name == "*":
                        raise InlineError(f"`from {stmt.module} import *` at line {stmt.lineno}: its names are unknown")
                    bind(alias.asname or alias.name, ("from", "." * stmt.level + (stmt.module or ""), alias.name))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                    targets(target)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                targets(stmt.target)
                visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                visit(stmt.body)
            elif isinstance(stmt, (ast.If, ast.While)):
                visit(stmt.body)
                visit(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body)
                for handler in stmt.handlers:
                    if handler.name:
                        bind(handler.name, ("other",))
                    visit(handler.body)
                visit(stmt.orelse)
                visit(stmt.finalbody)
        for stmt in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(stmt, ast.NamedExpr) and isinstance(stmt.target, ast.Name):
                bind(stmt.target.id, ("other",))

    visit(tree.body)
    return out


def module_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (a plain `import top.sub` excepted: it binds the
    same module object whoever runs it)."""
    return {name for name, keys in bindings(tree).items() if keys != {("plain", name)}}


def shared_imports(tree: ast.Module, taken: dict[str, set[tuple]]) -> set[str]:
    """The names this module binds only by importing (`import triton.language as tl`) the same way
    as the code already in the file (`taken`: bindings() of it), or that nothing there binds:
    they keep their names (Triton's CPU interpreter reads `tl.constexpr` by its text)."""
    keep = set()
    for name, keys in bindings(tree).items():
        if len(keys) == 1 and next(iter(keys))[0] in ("import", "from") and taken.get(name, keys) == keys:
            keep.add(name)
    return keep


def _local_names(node: ast.AST) -> set[str]:
    """The names a function, lambda or comprehension binds in its own scope."""
    local: set[str] = set()
    declared_global: set[str] = set()
    args = getattr(node, "args", None)
    if isinstance(args, ast.arguments):
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None:
                local.add(a.arg)
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        for gen in node.generators:
            for sub in ast.walk(gen.target):
                if isinstance(sub, ast.Name):
                    local.add(sub.id)
        return local
    body = node.body if isinstance(node.body, list) else [node.body]
    stack = list(body)
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Global):
            declared_global.update(sub.names)
            continue
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            local.add(sub.name)
            stack.extend(sub.decorator_list)
            if not isinstance(sub, ast.ClassDef):
                stack.extend(d for d in sub.args.defaults + sub.args.kw_defaults if d is not None)
            else:
                stack.extend(sub.bases)
            continue  # its body is a scope of its own
        if isinstance(sub, (ast.Lambda, ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            continue
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            local.add(sub.id)
        elif isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
            local.add(sub.target.id)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            local.update((a.asname or a.name).split(".")[0] for a in sub.names)
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            local.add(sub.name)
        stack.extend(ast.iter_child_nodes(sub))
    return local - declared_global


class _Renamer(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.scopes: list[tuple[bool, set[str]]] = []  # (a class body?, its local names), innermost last

    def _new(self, name: str) -> str:
        if name not in self.names:
            return name
        for depth, (is_class, local) in enumerate(reversed(self.scopes)):
            if is_class and depth:  # a class body's names do not reach the functions inside it
                continue
            if name in local:
                return name
        return self.names[name]

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._new(node.id)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id in ("globals", "vars") and not node.args \
                and node.func.id not in self.names:
            raise InlineError(f"{node.func.id}() at line {node.lineno}: names reached by string cannot be renamed")
        return self.generic_visit(node)

    def _body(self, node: ast.AST, is_class: bool) -> None:
        self.scopes.append((is_class, _local_names(node)))
        body = node.body
        node.body = [self.visit(s) for s in body] if isinstance(body, list) else self.visit(body)
        self.scopes.pop()

    def _arguments(self, args: ast.arguments) -> None:
        args.defaults = [self.visit(d) for d in args.defaults]
        args.kw_defaults = [self.visit(d) if d is not None else None for d in args.kw_defaults]
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None:
                a.annotation = self.visit(a.annotation)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        node.name = self._new(node.name)
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        self._arguments(node.args)
        if node.returns is not None:
            node.returns = self.visit(node.returns)
        self._body(node, is_class=False)
        return node

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self._arguments(node.args)
        self._body(node, is_class=False)
        return node

    def _comprehension(self, node: ast.AST) -> ast.AST:
        # The first iterable is evaluated in the enclosing scope.
        node.generators[0].iter = self.visit(node.generators[0].iter)
        self.scopes.append((False, _local_names(node)))
        for i, gen in enumerate(node.generators):
            gen.target = self.visit(gen.target)
            if i:
                gen.iter = self.visit(gen.iter)
            gen.ifs = [self.visit(c) for c in gen.ifs]
        for field in ("elt", "key", "value"):
            if getattr(node, field, None) is not None:
                setattr(node, field, self.visit(getattr(node, field)))
        self.scopes.pop()
        return node

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self._new(node.name)
        node.bases = [self.visit(b) for b in node.bases]
        node.keywords = [self.visit(k) for k in node.keywords]
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        self._body(node, is_class=True)
        return node

    def visit_Global(self, node: ast.Global) -> ast.AST:
        node.names = [self.names.get(n, n) for n in node.names]
        return node

    def visit_Import(self, node: ast.Import) -> ast.AST:
        for alias in node.names:
            if alias.asname:
                alias.asname = self._new(alias.asname)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        if node.module != "__future__":
            for alias in node.names:
                bound = alias.asname or alias.name
                new = self._new(bound)
                if new != bound:
                    alias.asname = new
        return node


def inline(source: str, prefix: str, filename: str = "<kernel>",
           taken: dict[str, set[tuple]] | None = None) -> Inlined:
    """`source` with its module-level names prefixed (module doc), but for the imports it shares
    with `taken` (the bindings of the code already in the file, which this call extends with the
    names it keeps). InlineError when it cannot be."""
    try:
        tree = pyast.parse(source, filename)
    except SyntaxError as exc:
        raise InlineError(f"{filename}: {exc.msg} (line {exc.lineno})") from None
    futures = [f"from __future__ import {', '.join(a.name for a in s.names)}" for s in tree.body
               if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    tree.body = [s for s in tree.body if not (isinstance(s, ast.ImportFrom) and s.module == "__future__")]
    keep = shared_imports(tree, taken if taken is not None else {})
    names = {name: f"{prefix}{name}" for name in sorted(module_names(tree) - keep)}
    if taken is not None:
        for name, keys in bindings(tree).items():
            if name in keep or keys == {("plain", name)}:
                taken.setdefault(name, set()).update(keys)
    tree = _Renamer(names).visit(tree)
    ast.fix_missing_locations(tree)
    return Inlined(code=ast.unparse(tree), futures=futures, names=names)


def split_futures(source: str) -> tuple[list[str], str]:
    """(the `from __future__` lines, the rest) of a module kept as written."""
    tree = pyast.parse(source)
    futures = [s for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    if not futures:
        return [], source
    lines = source.splitlines(keepends=True)
    drop = {n for s in futures for n in range(s.lineno - 1, s.end_lineno)}
    kept = "".join("\n" if i in drop else line for i, line in enumerate(lines))
    return [f"from __future__ import {', '.join(a.name for a in s.names)}" for s in futures], kept

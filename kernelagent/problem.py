"""Problem and candidate files: static checks done in the caller's process.

A problem is a KernelBench-format Python file: `class Model(nn.Module)`, `get_inputs()`
and `get_init_inputs()`. These checks only parse the file (no import, no torch), so a
broken problem is reported in one line before any process is started. Whatever the
file does when it runs is checked again, in the harness's own processes.

Optional module-level extras a problem may declare (all documented in docs/concepts/problems.md):

    ATOL, RTOL                 tolerance override (default: by output dtype, see
                               kernelagent.harness.config.DEFAULT_TOLERANCES)
    get_extra_inputs()         list of extra input lists, checked as generalisation
                               tests (a kernel that passes only the main shape is flagged)
    get_smoke_inputs()         small inputs used on the CPU / Triton interpreter
    get_smoke_init_inputs()    constructor arguments to go with the smoke inputs
    get_flops(*inputs)         floating-point operations for those inputs (roofline)
    ALT_DISTRIBUTION = False   opt out of the signed-normal input check
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from kernelagent.errors import UserError
from kernelagent import pyast

REQUIRED_PROBLEM_NAMES = ("Model", "get_inputs", "get_init_inputs")


class ProblemError(UserError):
    """The problem file is missing or malformed."""


class MissingDependencyError(ProblemError):
    """The problem imports a package that is not installed here (einops, transformers, ...)."""

    def __init__(self, path: str | Path, package: str):
        self.package = package
        super().__init__(f"{path}: the problem needs the package {package!r}, which is not installed "
                         f"(install it, e.g. pip install {package})")


class CandidateFileError(UserError):
    """The candidate file cannot be read (a missing candidate is bad usage)."""


@dataclass(frozen=True)
class Problem:
    path: Path
    source: str
    sha256: str
    name: str  # file stem, e.g. "19_ReLU"
    level: str | None  # "level1" when the file sits in a folder of that name

    @property
    def display(self) -> str:
        return f"{self.level}/{self.name}" if self.level else self.name


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: defs, classes, assignments and imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return names


_IMPORT_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    """Whether a try's handlers catch a failed import (then the import is optional)."""
    for h in handlers:
        if h.type is None:
            return True
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any((t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")) in _IMPORT_GUARDS for t in types):
            return True
    return False


def imported_modules(tree: ast.Module) -> list[str]:
    """Top-level packages a module imports unconditionally (not inside a try that catches
    ImportError), in order of appearance. Relative imports are left out."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Try) and _guarded(node.handlers):
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            names = []
        for name in names:
            root = name.split(".")[0]
            if root not in found and root != "__future__":
                found.append(root)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def missing_dependency(tree: ast.Module) -> str | None:
    """The first package the module imports that cannot be found here, or None. Found by
    importlib's finders only: nothing of the problem (or the package) is executed."""
    import importlib.util
    import sys

    for root in imported_modules(tree):
        if root in sys.modules or root in sys.builtin_module_names:
            continue
        try:
            if importlib.util.find_spec(root) is None:
                return root
        except (ImportError, ValueError):
            return root
    return None


def parse_source(source: str, filename: str) -> ast.Module:
    """Parse, turning a SyntaxError into a one-line message with the line number."""
    try:
        return pyast.parse(source, filename=filename)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" if exc.lineno else "unknown line"
        text = (exc.text or "").strip()
        detail = f": {text}" if text else ""
        raise ProblemError(f"{filename}: syntax error at {where}: {exc.msg}{detail}") from None


def load_problem(path: str | Path, check_dependencies: bool = True) -> Problem:
    """Read and statically validate a problem file. Raises ProblemError with one line;
    MissingDependencyError (a ProblemError) when it imports a package that is not installed,
    unless `check_dependencies` is False (the caller then asks `missing_dependency` itself)."""
    path = Path(path)
    if not path.exists():
        raise ProblemError(f"problem file not found: {path}")
    if not path.is_file():
        raise ProblemError(f"problem path is not a file: {path}")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(f"cannot read problem file {path}: {exc}") from None
    tree = parse_source(source, str(path))
    missing = [n for n in REQUIRED_PROBLEM_NAMES if n not in top_level_names(tree)]
    if missing:
        raise ProblemError(
            f"{path}: not a KernelBench problem: missing {', '.join(missing)} "
            "(a problem defines class Model(nn.Module), get_inputs() and get_init_inputs())"
        )
    if check_dependencies and (package := missing_dependency(tree)) is not None:
        raise MissingDependencyError(path, package)
    # The same rule as kernelagent.bench.discover.problem_key, so `display` is the problem's id.
    level = path.parent.name if re.match(r"^level\d+$", path.parent.name) else None
    return Problem(path=path.resolve(), source=source, sha256=sha256_text(source),
                   name=path.stem, level=level)


def read_candidate(path: str | Path) -> str:
    """Read a candidate file. Its content is judged by the harness, not here."""
    path = Path(path)
    if path.is_dir():
        raise CandidateFileError(f"the candidate is a directory, not a file: {path}")
    if not path.exists():
        raise CandidateFileError(f"candidate file not found: {path}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CandidateFileError(f"cannot read candidate file {path}: {exc.strerror or exc}") from None
    # Bytes that are not UTF-8 are the candidate's fault, like any other broken candidate:
    # they reach the harness as U+FFFD and get a compile_error verdict (exit 1), not exit 2.
    return raw.decode("utf-8", errors="replace")


def candidate_static_problem(source: str) -> str | None:
    """A one-line reason why `source` cannot be a candidate, or None if it may be one."""
    try:
        tree = pyast.parse(source, filename="candidate.py")
    except pyast.SourceTooComplex as exc:  # beyond what the static pass parses and walks
        return f"the candidate is too large or too deeply nested to check: {exc.msg}"
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes (Python < 3.12)
        if "\ufffd" in source or "\x00" in source:
            return "the candidate is not Python source text (binary content, or not UTF-8)"
        if not isinstance(exc, SyntaxError):
            return f"not valid Python source: {exc}"
        text = (exc.text or "").strip()
        return f"syntax error at line {exc.lineno}: {exc.msg}" + (f": {text}" if text else "")
    if "ModelNew" not in top_level_names(tree):
        return "the candidate defines no top-level `ModelNew` (class ModelNew(nn.Module) is required)"
    return None

"""Measurement notes live in the docs, not in the code (issue 57, step 7): a comment or docstring
keeps the rule, its reason in one clause and a pointer to the doc section that holds the figures,
with their date and device. A dated note (`20YY-MM-DD`) in a comment or docstring is the sign of a
run's narrative left in the code. Comments are read with `tokenize` and docstrings with `ast`, so a
date in a string used as data (a version, a test's fixture) is not counted."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "kernelagent"
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append(body[0].value)
    return out


def dated_lines(text: str) -> list[int]:
    """The lines of a module's source whose comment or docstring carries a date."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and DATE.search(tok.string):
            lines.add(tok.start[0])
    for doc in _docstrings(ast.parse(text)):
        for offset, line in enumerate(doc.value.splitlines()):
            if DATE.search(line):
                lines.add(doc.lineno + offset)
    return sorted(lines)


def dated_notes(path: Path) -> list[str]:
    """`file:line` of every comment or docstring line of `path` that carries a date."""
    rel = path.relative_to(REPO).as_posix()
    return [f"{rel}:{n}" for n in dated_lines(path.read_text(encoding="utf-8"))]


def test_no_dated_notes_in_code_comments():
    """Anywhere in the package, the harness server included (its 34 notes of 35ab29f were the last)."""
    found = [note for path in sorted(PACKAGE.rglob("*.py")) for note in dated_notes(path)]
    assert not found, ("dated measurement notes in comments or docstrings (move the figures to the "
                       "docs and point there):\n" + "\n".join(found))


def test_scanner_reads_comments_and_docstrings_not_data():
    source = ('"""Module (H100, 2026-11-26)."""\n'
              'VERSION = "2026-11-27"  # read on an H200, 2026-11-28\n'
              'def f():\n'
              '    """Ran 1 s (2026-11-29)."""\n'
              '    return "2026-11-30"\n')
    assert dated_lines(source) == [1, 2, 4]

"""`ast.parse` for a process with threads.

CPython before 3.12.1 keeps the AST constructor's recursion counter in state shared by every
thread, and the conversion can switch threads midway: two parses at once fail with
`SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). Evaluations,
bench workers and the MCP server parse problems and candidates from several threads (it broke
`Evaluator.map` in CI), so every parse in this package goes through this one lock. A parse
takes milliseconds; nothing waits long.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename)

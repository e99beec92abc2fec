"""`ast.parse` for a process with threads, bounded for a source we do not trust.

CPython before 3.12.1 keeps the AST constructor's recursion counter in state shared by every
thread, and the conversion can switch threads midway: two parses at once fail with
`SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). Evaluations,
bench workers and the MCP server parse problems and candidates from several threads (it broke
`Evaluator.map` in CI), so every parse in this package goes through this one lock. A parse
takes milliseconds; nothing waits long.

Every parse is bounded too (issue 54, class 5): a candidate's 5,000-term expression raised
RecursionError in `ast.parse` (the caller's static pass: `eval` exited 70 and the RL reward was
None), and a shallower one in the recursive AST visitors after it. A source longer than
MAX_SOURCE_CHARS, one the parser runs out of stack or memory on, or a tree deeper than
MAX_AST_DEPTH or larger than MAX_AST_NODES raises SourceTooComplex, a SyntaxError: every caller
already treats those as a source that cannot be a candidate (or a problem).
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()

MAX_SOURCE_CHARS = 4 << 20
# Honest code nests 10-30 levels; the static pass's visitors recurse about twice per level, so a
# tree this deep stays well inside the interpreter's 1,000 frames from any thread.
MAX_AST_DEPTH = 200
MAX_AST_NODES = 1_000_000


class SourceTooComplex(SyntaxError):
    """A source beyond the bounds the harness parses and walks (its reason in `msg`)."""


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), one thread at a time, within the bounds above."""
    if len(source) > MAX_SOURCE_CHARS:
        raise SourceTooComplex(f"the source is {len(source):,} characters long (at most {MAX_SOURCE_CHARS:,})")
    with _LOCK:
        try:
            tree = ast.parse(source, filename=filename)
        except (RecursionError, MemoryError):
            raise SourceTooComplex("an expression or statement nested too deeply for the parser (split it into "
                                   "smaller ones)") from None
    check_shape(tree)
    return tree


def check_shape(tree: ast.AST, max_depth: int = MAX_AST_DEPTH, max_nodes: int = MAX_AST_NODES) -> None:
    """SourceTooComplex where `tree` nests deeper than `max_depth` or has more than `max_nodes`
    nodes; walked without recursion."""
    stack = [(tree, 1)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > max_depth:
            raise SourceTooComplex(f"nested more than {max_depth} levels deep at line "
                                   f"{getattr(node, 'lineno', '?')} (a long chain of operators, say: split it into "
                                   "smaller expressions)")
        if nodes > max_nodes:
            raise SourceTooComplex(f"more than {max_nodes:,} syntax nodes")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))

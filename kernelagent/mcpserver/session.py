"""What an MCP session may touch and spend: the roots, the budgets, the evaluator.

Everything here is plain Python (no MCP import), so the rules are tested on their own:
- a path the client names is resolved (links followed) and must lie under one of the roots the
  server was started with (`--root`); otherwise the tool answers with an error that names the
  path and the roots, never the file's content;
- each session has a budget of evaluations and of evaluation seconds; a call that would pass it
  is refused before it starts, with what was spent and what the limit is;
- candidate code is text the client sends (or a file under a root); it goes through the same
  Evaluator, jail and verdict path as `kernelagent eval`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


class ToolInputError(ValueError):
    """A bad argument: the message says what to fix (sent as the tool's error, never a traceback)."""


class BudgetSpent(ToolInputError):
    """The session's evaluations or evaluation seconds are spent."""


@dataclass
class Budget:
    max_evaluations: int | None = None
    max_seconds: float | None = None
    evaluations: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reserve(self) -> None:
        with self.lock:
            if self.max_evaluations is not None and self.evaluations >= self.max_evaluations:
                raise BudgetSpent(f"this session's evaluation budget is spent ({self.evaluations}/"
                                  f"{self.max_evaluations} evaluations); start a new session or raise "
                                  "--max-evaluations")
            if self.max_seconds is not None and self.seconds >= self.max_seconds:
                raise BudgetSpent(f"this session's evaluation time is spent ({self.seconds:.0f}/"
                                  f"{self.max_seconds:.0f} s); start a new session or raise --max-gpu-seconds")
            self.evaluations += 1

    def charge(self, seconds: float) -> None:
        with self.lock:
            self.seconds += max(0.0, seconds)

    def snapshot(self) -> dict:
        return {"evaluations": self.evaluations, "max_evaluations": self.max_evaluations,
                "seconds": round(self.seconds, 3), "max_seconds": self.max_seconds}


class Roots:
    def __init__(self, roots: list[str | Path]) -> None:
        self.roots = [Path(r).resolve() for r in roots]

    def resolve(self, value: str, what: str = "path") -> Path:
        """The file at `value` (relative to the first root), if it lies under a root."""
        if not isinstance(value, str) or not value.strip():
            raise ToolInputError(f"`{what}` must be a non-empty path")
        raw = Path(value).expanduser()
        candidates = [raw] if raw.is_absolute() else [root / raw for root in self.roots]
        for path in candidates:
            resolved = path.resolve()
            if self.contains(resolved):
                if not resolved.is_file():
                    raise ToolInputError(f"`{what}` {value}: no such file under the roots")
                return resolved
        roots = ", ".join(str(r) for r in self.roots) or "none"
        raise ToolInputError(f"`{what}` {value} is outside the server's roots ({roots}); only files under "
                             "a --root can be read")

    def contains(self, path: Path) -> bool:
        """`path` (resolved: links followed) is a root or lies under one."""
        resolved = path.resolve()
        return any(resolved == root or resolved.is_relative_to(root) for root in self.roots)

    def require(self, path: Path, what: str) -> Path:
        """`path` resolved, or ToolInputError when it lies outside every root."""
        if not self.contains(path):
            raise ToolInputError(f"`{what}` {path} is outside the server's roots")
        return path.resolve()

    def problems(self) -> list[Path]:
        """Problem files under the roots (as bench finds them), for list_problems and resources."""
        from kernelagent.rl.dataset import find_problems

        out: list[Path] = []
        for root in self.roots:
            try:
                out.extend(Path(p).resolve() for p in find_problems(root))
            except Exception:  # noqa: BLE001 - a root without problems lists none
                continue
        return sorted(set(out))


@dataclass
class Sessions:
    """Budgets per client session (a stdio server has one session; HTTP has one per client)."""

    max_evaluations: int | None = None
    max_seconds: float | None = None
    budgets: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def budget(self, key: object) -> Budget:
        with self.lock:
            if key not in self.budgets:
                self.budgets[key] = Budget(self.max_evaluations, self.max_seconds)
            return self.budgets[key]


@contextmanager
def timed(budget: Budget) -> Iterator[None]:
    """Charge the wall time of the block (an evaluation) to `budget`."""
    started = time.monotonic()
    try:
        yield
    finally:
        budget.charge(time.monotonic() - started)

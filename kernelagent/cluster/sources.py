"""Problems from source text (a dataset column, a job sent to a worker on another machine that does
not have the file): written once, by content hash, under the temp folder, so that the harness and
the input inspector see an ordinary file. Used by the cluster's actors and by kernelagent/rl."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from kernelagent import settings

_lock = threading.Lock()
_cache: dict[tuple[str, str], Any] = {}


def problems_root() -> Path:
    return settings.get("KERNELAGENT_RL_PROBLEMS") or Path(tempfile.gettempdir()) / "kernelagent-rl-problems"


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", part).strip("._") or "problem"


def problem_from_source(source: str, problem_id: str | None = None) -> Any:
    """A `Problem` for `source`. `problem_id` like "level1/1_relu" keeps the level and name."""
    from kernelagent.problem import load_problem

    sha = hashlib.sha256(source.encode("utf-8")).hexdigest()
    key = (sha, problem_id or "")
    with _lock:
        if key in _cache:
            return _cache[key]
    parts = [_safe(p) for p in (problem_id or "problem").replace("\\", "/").split("/") if p][-2:]
    name = parts[-1][:-3] if parts[-1].endswith(".py") else parts[-1]
    folder = problems_root() / sha[:16]
    if len(parts) == 2:
        folder = folder / parts[0]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != source:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)
    problem = load_problem(path)  # the same static checks as a file on disk
    with _lock:
        _cache[key] = problem
    return problem

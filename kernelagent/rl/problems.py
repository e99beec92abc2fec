"""Problems for rewards and environments: from a path, or from source text (a dataset column
on a machine that does not have the file). Source text is written once, by content hash,
under the temp folder so the harness and the input inspector see an ordinary file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelagent.cluster.sources import problem_from_source, problems_root  # noqa: F401 - their home is cluster/


def resolve_problem(path: str | Path | None = None, source: str | None = None,
                    problem_id: str | None = None) -> Any:
    """Source text wins over a path (it is what the prompt showed, and it travels)."""
    from kernelagent.problem import load_problem

    if source:
        return problem_from_source(source, problem_id)
    if path:
        return load_problem(path)
    raise ValueError("a problem needs a path or its source")


def problem_id_for(path: Path, root: Path | None = None) -> str:
    """The problem's id, "level1/1_relu" for benchmarks/level1/1_relu.py: bench's rule
    (kernelagent.bench.discover.problem_key); `root` is accepted for old callers and ignored,
    so that an id never depends on the folder a dataset was built from."""
    from kernelagent.bench.discover import problem_key

    return problem_key(path)

"""The candidate's sandbox, entered first thing in its process (forked from the server), before
any candidate code exists there. Placeholder until the namespace jail lands: mode "none" only."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def enter(workdir: Path, options: dict[str, Any], keep_fds: list[int], log_path: Path) -> dict[str, Any]:
    mode = options.get("mode", "none")
    if mode != "none":
        raise RuntimeError(f"isolation mode {mode!r} is not available")
    return {"mode": "none"}


def resolve(requested: str, scratch_root: Path) -> dict[str, Any]:
    """The jail every job of this server gets, decided once at server start."""
    if requested not in ("auto", "none"):
        raise RuntimeError(f"isolation {requested!r} is not available here")
    return {"mode": "none", "describe": {"jail": "none"}}

"""trajectory.json: the whole run, rewritten atomically after every step, so a crash or a
kill at any moment leaves the last complete step on disk (never a half-written file)."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import kernelagent

FORMAT_VERSION = 1


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON to a temp file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Trajectory:
    """Every message sent to the model, every reply (tokens, cost, latency, raw), every tool
    call with its arguments, result text and harness verdict, plus config and environment."""

    def __init__(self, path: str | Path | None, config: dict | None = None,
                 environment: dict | None = None, problem: dict | None = None) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "kernelagent_version": kernelagent.__version__,
            "status": "running",
            "started_at": now_iso(),
            "updated_at": now_iso(),
            "config": config or {},
            "environment": environment or {},
            "problem": problem or {},
            "messages": [],
            "steps": [],
            "final": None,
        }

    @property
    def messages(self) -> list[dict]:
        return self.data["messages"]

    @property
    def steps(self) -> list[dict]:
        return self.data["steps"]

    def add_message(self, message: dict) -> None:
        self.data["messages"].append(message)

    def add_step(self, step: dict) -> None:
        self.data["steps"].append(step)
        self.save()

    def save(self) -> None:
        self.data["updated_at"] = now_iso()
        if self.path is not None:
            write_json_atomic(self.path, self.data)

    def finish(self, status: str, final: dict | None = None) -> None:
        self.data["status"] = status
        self.data["final"] = final
        self.save()

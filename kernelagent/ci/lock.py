"""`kernelagent.lock.json`: what the last recorded verification saw, per kernel.

Reviewers read it in pull requests, so it is written for small diffs: sorted keys, two-space
indent, one trailing newline, floats rounded to four significant digits, and an entry whose
facts did not change keeps its old date (a re-run of `verify --update-lock` on an unchanged
repository leaves the file byte for byte as it was).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from pathlib import Path
from typing import Any

from kernelagent.errors import UserError

LOCK_FORMAT_VERSION = 1


def _round(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


def read_lock(path: Path) -> dict[str, dict[str, Any]]:
    """The lock's entries by kernel name ({} when there is no lock yet)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable lock file ({exc}); delete it and run "
                        "`kernelagent verify --update-lock`") from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        raise UserError(f"{path}: not a kernelagent lock file (no `kernels` object)")
    version = data.get("format_version")
    if version != LOCK_FORMAT_VERSION:
        raise UserError(f"{path}: lock format {version!r}, this kernelagent reads "
                        f"{LOCK_FORMAT_VERSION}; run `kernelagent verify --update-lock`")
    return data["kernels"]


def render_lock(entries: dict[str, dict[str, Any]]) -> str:
    data = {"format_version": LOCK_FORMAT_VERSION,
            "kernels": {name: _round(entries[name]) for name in sorted(entries)}}
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_lock(path: Path, entries: dict[str, dict[str, Any]]) -> bool:
    """Write atomically; returns False (and leaves the file alone) when nothing changed."""
    text = render_lock(entries)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return True


def merge_entry(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """`new`, but with `old`'s date when nothing else changed (so the lock does not churn)."""
    if old is not None:
        same = {k: v for k, v in _round(new).items() if k != "date"} == \
            {k: v for k, v in old.items() if k != "date"}
        if same and "date" in old:
            return {**new, "date": old["date"]}
    return new


def today() -> str:
    return dt.datetime.now(dt.timezone.utc).date().isoformat()

"""`optimize --resume DIR`: the run's own model, API base, temperature and budget, unless a flag
on the command line overrides one, so the "to go on" command printed after Ctrl-C runs as
printed, and a resume never falls back to the default budget (a `--max-turns 6` run resumed as
`turn 3/20` spent more than the user allowed).

What is reused comes from the run's records: a search's trajectory.json (`config`), a whole
model's summary.json (`model_info` and `budget`). Neither holds a key: the key comes from
--api-key or the provider's variable, as on the first run. One line on stderr says what was
reused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernelagent.models.scripted import PREFIX

# flag name (the typer parameter) -> how it is written on the command line
FLAGS = {"model": "--model", "api_base": "--api-base", "temperature": "--temperature", "max_turns": "--max-turns",
         "max_tokens": "--max-tokens", "max_cost": "--max-cost", "timeout": "--timeout"}


def model_to_record(model: str | None) -> str | None:
    """The --model string as it is kept: a scripted model's files as absolute paths, so the
    resume works from any folder."""
    if not model or not model.startswith(PREFIX):
        return model
    parts = [p.strip() for p in model[len(PREFIX):].split(",") if p.strip()]
    return PREFIX + ",".join(str(Path(p).resolve()) for p in parts)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_flags(folder: Path, whole_model: bool) -> dict[str, Any]:
    """The flags of the run in `folder` that a resume reuses (only those it recorded)."""
    found: dict[str, Any] = {}
    if whole_model:
        summary = _read(folder / "summary.json")
        info = summary.get("model_info") if isinstance(summary.get("model_info"), dict) else {}
        budget = summary.get("budget") if isinstance(summary.get("budget"), dict) else {}
        for key, name in (("max_turns", "max_turns"), ("max_tokens", "max_tokens"), ("max_cost", "max_cost_usd"),
                          ("timeout", "timeout_s")):
            if name in budget:
                found[key] = budget[name]
        name = info.get("spec") or summary.get("model")
    else:
        config = _read(folder / "trajectory.json").get("config")
        config = config if isinstance(config, dict) else {}
        info = config.get("model") if isinstance(config.get("model"), dict) else {}
        for key in ("max_turns", "max_tokens", "max_cost", "timeout"):
            if key in config:
                found[key] = config[key]
        name = info.get("spec") or info.get("name")
    # A run recorded before the model string was kept has only the model's name; a scripted
    # model's name is not enough to find its files again.
    if isinstance(name, str) and name and (info.get("spec") or not name.startswith(PREFIX)):
        found["model"] = name
        for key in ("api_base", "temperature"):
            if key in info:
                found[key] = info[key]
    return found


def reuse(given: dict[str, Any], recorded: dict[str, Any], on_command_line: set[str]) -> tuple[dict[str, Any], str]:
    """The flags to resume with (the recorded value where the command line gives none), and one
    line naming what was reused ("" when nothing was)."""
    values = dict(given)
    reused = []
    for key in FLAGS:
        if key in recorded and key not in on_command_line:
            value = recorded[key]
            values[key] = value
            if value is not None:
                reused.append(f"{FLAGS[key]} {value}")
    line = (f"resuming with the run's own {' '.join(reused)} (a flag given here overrides it)" if reused else "")
    return values, line

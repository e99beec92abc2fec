"""Prompt templates: a jinja2 environment over the `prompts/` folder.

The templates live at the repository's top level in `prompts/`; `kernelagent/prompts` is a
symlink to it, so the package data of a built wheel carries real copies of them. Lookup
order: the `prompts` folder inside the installed package, then the repository's top-level
`prompts/` (a checkout whose symlink was lost, e.g. on Windows), then `$KERNELAGENT_PROMPTS`
first of all when set (to try prompt variants without touching the package).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from kernelagent import settings

ENV_PROMPTS = "KERNELAGENT_PROMPTS"


def prompt_dirs() -> list[Path]:
    dirs = []
    if settings.get(ENV_PROMPTS) is not None:
        dirs.append(settings.get(ENV_PROMPTS))
    try:
        packaged = resources.files("kernelagent") / "prompts"
        dirs.append(Path(str(packaged)))
    except (ModuleNotFoundError, TypeError):
        pass
    dirs.append(Path(__file__).resolve().parents[2] / "prompts")
    return [d for d in dirs if d.is_dir()]


def truncate(text: str, max_chars: int = 8000, max_lines: int = 200) -> str:
    """Keep the head and the tail of a long text and say, in the middle, what was cut."""
    lines = text.splitlines()
    if len(text) <= max_chars and len(lines) <= max_lines:
        return text
    head_lines, tail_lines = max_lines // 2, max_lines - max_lines // 2
    head_chars, tail_chars = max_chars // 2, max_chars - max_chars // 2
    head, used = [], 0
    for line in lines[:head_lines]:
        if used + len(line) + 1 > head_chars:
            break
        head.append(line)
        used += len(line) + 1
    tail, used = [], 0
    for line in reversed(lines[len(head):][-tail_lines:]):
        if used + len(line) + 1 > tail_chars:
            break
        tail.append(line)
        used += len(line) + 1
    tail.reverse()
    if not head and not tail:  # one enormous line: cut by characters
        cut = len(text) - max_chars
        return (f"{text[:head_chars]}\n[... output cut: {cut} characters omitted ...]\n"
                f"{text[-tail_chars:]}")
    omitted = lines[len(head):len(lines) - len(tail)]
    note = (f"[... output cut: {len(omitted)} lines ({sum(len(x) + 1 for x in omitted)} "
            f"characters) omitted from the middle ...]")
    return "\n".join(head + [note] + tail)


class Prompts:
    """`render("task", **context)` renders prompts/task.j2."""

    def __init__(self, directory: str | Path | None = None) -> None:
        dirs = [Path(directory)] if directory else prompt_dirs()
        if not dirs:
            raise FileNotFoundError("kernelagent prompt templates not found (prompts/*.j2)")
        self.directories = dirs
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
            undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
            keep_trailing_newline=False, autoescape=False)
        self.env.filters["cut"] = truncate

    def render(self, name: str, **context: Any) -> str:
        if not name.endswith(".j2"):
            name += ".j2"
        return self.env.get_template(name).render(**context).strip()

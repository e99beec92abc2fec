"""MkDocs hooks: reference pages generated from the code, so they cannot drift from it.

- `<!-- cli-reference -->` becomes every command, subcommand and option of the typer app, from the
  same click objects `kernelagent --help` prints (tests/test_docs.py compares the two);
- `<!-- statuses -->` becomes the harness's statuses (harness/result.py `Status`), every flag kind
  with its severity (`SEVERITY`), and the exit codes (kernelagent/errors.py).
"""

from __future__ import annotations

import inspect

MARK_CLI = "<!-- cli-reference -->"
MARK_STATUS = "<!-- statuses -->"


def cli_markdown() -> str:
    import typer.main

    from kernelagent.cli import app

    root = typer.main.get_command(app)
    out: list[str] = []

    def walk(cmd, path: list[str]) -> None:  # click's classes, as typer ships them (duck-typed)
        name = " ".join(path)
        ctx = cmd.context_class(cmd, info_name=name)
        out.append(f"## `{name}`\n")
        help_text = inspect.cleandoc(cmd.help or "").split("\n\n")[0].replace("\n", " ")
        if help_text:
            out.append(help_text + "\n")
        rows = []
        for param in cmd.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                if getattr(param, "param_type_name", "") == "argument":
                    rows.append((f"`{param.human_readable_name}`", "argument"))
                continue
            opts, text = record
            rows.append((f"`{opts}`", " ".join(text.split()).replace("|", "\\|")))
        if rows:
            out.append("| option | meaning |\n| --- | --- |")
            out.extend(f"| {a} | {b} |" for a, b in rows)
            out.append("")
        if hasattr(cmd, "list_commands"):
            for sub in sorted(cmd.list_commands(ctx)):
                walk(cmd.get_command(ctx, sub), path + [sub])

    walk(root, ["kernelagent"])
    return "\n".join(out)


def status_markdown() -> str:
    from kernelagent import errors
    from kernelagent.harness.result import SEVERITY, Status

    out = ["## Statuses\n", "| status | what it means |", "| --- | --- |"]
    source = inspect.getsource(Status).splitlines()
    for name, value in vars(Status).items():
        if name.isupper() and isinstance(value, str):
            line = next((s for s in source if s.strip().startswith(f"{name} =")), "")
            note = line.split("#", 1)[1].strip() if "#" in line else ""
            out.append(f"| `{value}` | {note} |")
    out += ["", "## Flag kinds\n", "A `reject` flag rejects the candidate, `review` holds it back from counting as a win, "
            "`info` only reports.\n", "| kind | severity |", "| --- | --- |"]
    out += [f"| `{kind}` | {severity} |" for kind, severity in sorted(SEVERITY.items())]
    out += ["", "## Exit codes\n", "| code | name |", "| --- | --- |"]
    out += [f"| {value} | `{name}` |" for name, value in vars(errors).items() if name.startswith("EXIT_")]
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page, config, files):  # noqa: ARG001 - MkDocs' hook signature
    if MARK_CLI in markdown:
        markdown = markdown.replace(MARK_CLI, cli_markdown())
    if MARK_STATUS in markdown:
        markdown = markdown.replace(MARK_STATUS, status_markdown())
    return markdown

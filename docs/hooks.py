"""MkDocs hooks: reference pages generated from the code, so they cannot drift from it.

- `<!-- cli-reference -->` becomes every command, subcommand and option of the typer app, from the
  same click objects `kernelagent --help` prints (tests/test_docs.py compares the two); help text
  is escaped, so a placeholder such as `<problem-stem>` shows as written;
- `<!-- statuses -->` becomes the harness's statuses (harness/result.py `Status`), every flag kind
  with its severity (`SEVERITY`), and the exit codes (kernelagent/errors.py);
- `<!-- settings -->` becomes every `KERNELAGENT_*` environment variable, from the one table of
  them (kernelagent/settings.py `SETTINGS`): its type, default and meaning (tests/test_settings.py);
- `<!-- http-statuses serve -->` and `<!-- http-statuses mcp -->` become the HTTP statuses of the
  reward service and of the MCP server: the shared stack's (serving/guard.py `STATUSES`) and the
  server's own (rl/service.py, mcpserver/http_app.py `STATUSES`).
"""

from __future__ import annotations

import inspect

MARK_CLI = "<!-- cli-reference -->"
MARK_STATUS = "<!-- statuses -->"
MARK_SETTINGS = "<!-- settings -->"
MARK_HTTP = {"serve": ("<!-- http-statuses serve -->", "kernelagent.rl.service"),
             "mcp": ("<!-- http-statuses mcp -->", "kernelagent.mcpserver.http_app")}


def plain(text: str) -> str:
    """Help text as Markdown shows it literally: `runs/<timestamp>-<problem>` is text, not two HTML
    tags that a browser drops (Markdown passes raw HTML through)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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
            out.append(plain(help_text) + "\n")
        rows = []
        for param in cmd.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                if getattr(param, "param_type_name", "") == "argument":
                    rows.append((f"`{param.human_readable_name}`", "argument"))
                continue
            opts, text = record
            rows.append((f"`{opts}`", plain(" ".join(text.split())).replace("|", "\\|")))
        if rows:
            out.append("| option | meaning |\n| --- | --- |")
            out.extend(f"| {a} | {b} |" for a, b in rows)
            out.append("")
        if hasattr(cmd, "list_commands"):
            for sub in sorted(cmd.list_commands(ctx)):
                walk(cmd.get_command(ctx, sub), path + [sub])

    walk(root, ["kernelagent"])
    return "\n".join(out)


# What a status means for the user and what to do about it (the meanings are Status's comments).
STATUS_TODO = {
    "correct": "nothing: look at the speedups and their intervals",
    "compiled": "a compile-only run (or CUDA without a GPU): run on a GPU for correctness and timing",
    "incorrect": "read the trial that failed (max abs/rel error, which input set) and fix the kernel",
    "compile_error": "read the first error in the log: syntax, import, a missing ModelNew, or the first call; "
                     "split an expression nested too deep for the static pass",
    "runtime_error": "read the exception in the log (shapes, out-of-bounds, dtypes)",
    "timeout": "the stage limit was passed: look for a hang or a far too slow kernel (--timeout-scale)",
    "crashed": "the process died (a CUDA fault, os._exit): run the kernel alone under compute-sanitizer",
    "rejected": "a reject flag says which defence caught what: do the work in the candidate's own kernels",
    "bad_problem": "the problem file is broken: fix the problem, not the kernel",
    "harness_error": "not the candidate's fault: retry; report it if it stays",
    "too_large": "the problem does not fit this device: a bigger device, or smaller sizes",
}
ACTION = {"reject": "change the kernel: the result does not count",
          "review": "the result does not count as a win until the cause is gone",
          "info": "for information: the verdict stands"}


def status_markdown() -> str:
    from kernelagent import errors
    from kernelagent.harness.result import SEVERITY, Status

    out = ["## Statuses\n", "| status | what it means | what to do |", "| --- | --- | --- |"]
    source = inspect.getsource(Status).splitlines()
    for name, value in vars(Status).items():
        if name.isupper() and isinstance(value, str):
            line = next((s for s in source if s.strip().startswith(f"{name} =")), "")
            note = line.split("#", 1)[1].strip() if "#" in line else ""
            out.append(f"| `{value}` | {plain(note)} | {plain(STATUS_TODO.get(value, ''))} |")
    out += ["", "## Flag kinds\n", "Each flag's message says what was seen; the kind's defence is described in "
            "[the defences](../concepts/defences.md).\n", "| kind | severity | what to do |", "| --- | --- | --- |"]
    out += [f"| `{kind}` | {severity} | {ACTION[severity]} |" for kind, severity in sorted(SEVERITY.items())]
    out += ["", "## Exit codes\n", "The same for every command; what each means per command is in "
            "[commands and exit codes](commands.md).\n", "| code | name |", "| --- | --- |"]
    out += [f"| {value} | `{name}` |" for name, value in vars(errors).items() if name.startswith("EXIT_")]
    return "\n".join(out) + "\n"


SETTING_ROLES = {"user": "Yours to set",
                 "internal": "Set by the harness for its own processes (never by hand)",
                 "tests": "Read by the test suite and the device scripts, not by the package"}


def settings_markdown() -> str:
    from kernelagent import settings

    def shown(value) -> str:
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return "`1`" if value else "`0`"
        return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"

    out = [f"A boolean is one of {', '.join(f'`{v}`' for v in settings.TRUE)} or "
           f"{', '.join(f'`{v}`' for v in settings.FALSE)} (any case); an empty variable is an unset one.\n"]
    for role, title in SETTING_ROLES.items():
        out += [f"## {title}\n", "| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
        for s in settings.SETTINGS:
            if s.role == role:
                doc = plain(s.doc).replace("|", "\\|")
                out.append(f"| `{s.name}` | {plain(s.expected())} | {shown(s.default)} | {doc} |")
        out.append("")
    return "\n".join(out)


def http_status_markdown(module: str) -> str:
    import importlib

    from kernelagent.serving.guard import STATUSES as SHARED

    own = importlib.import_module(module).STATUSES
    out = ["| status | when | from |", "| --- | --- | --- |"]
    for code in sorted(set(SHARED) | set(own)):
        for text, source in ((SHARED.get(code), "the shared stack"), (own.get(code), "this server")):
            if text:
                out.append(f"| {code} | {text} | {source} |")
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page, config, files):  # noqa: ARG001 - MkDocs' hook signature
    if MARK_CLI in markdown:
        markdown = markdown.replace(MARK_CLI, cli_markdown())
    if MARK_STATUS in markdown:
        markdown = markdown.replace(MARK_STATUS, status_markdown())
    if MARK_SETTINGS in markdown:
        markdown = markdown.replace(MARK_SETTINGS, settings_markdown())
    for mark, module in MARK_HTTP.values():
        if mark in markdown:
            markdown = markdown.replace(mark, http_status_markdown(module))
    return markdown

"""The `kernelagent` command. Commands are thin: they resolve options and call the library.

Exit codes (documented in docs/reference/commands.md):
    0  success (eval: correct; optimize: correct and meets the target)
    1  the candidate is incorrect or failed; no correct kernel was found
    2  bad input or configuration (one clear line, never a traceback)
    3  optimize: correct, but short of the speed target
    4  eval: the problem is too large for this machine (too_large)
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import logging
import sys

import typer

from kernelagent import __version__, settings
from kernelagent.cli.core import Command, typer_app
from kernelagent.errors import EXIT_INTERRUPTED, UserError

# no_args_is_help: bare `kernelagent` prints the help and exits 0 (Group.main).
app = typer_app(name="kernelagent", help="Turn a PyTorch reference module into a verified, faster GPU kernel.",
                no_args_is_help=True)


def log_handler(console=None) -> logging.Handler:
    """The rich handler of the commands' logging (stderr). A record may quote a candidate (its
    reason, its log, an exception's message): its whole text, traceback included, reaches the
    terminal through kernelagent.text.terminal_text (rich markup is off in log messages)."""
    from rich.console import Console
    from rich.logging import RichHandler

    from kernelagent.text import terminal_text

    class Handler(RichHandler):
        def format(self, record: logging.LogRecord) -> str:
            return terminal_text(super().format(record))

    return Handler(console=console or Console(stderr=True), show_path=False, rich_tracebacks=False, markup=False)


def setup_logging(verbose: bool) -> None:
    """Once per process, through rich, on stderr."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[log_handler()],
        force=True,
    )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kernelagent {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging on stderr."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    setup_logging(verbose)
    try:  # a malformed or unknown KERNELAGENT_* variable: one line, exit 2, before any command runs
        settings.check_environment()
    except settings.SettingError as exc:
        raise UserError(str(exc)) from None


# (module, attribute, command name). A module may hold a command function or a typer
# sub-app (`typer.Typer`, added as a command group). Command modules stay light: heavy
# imports happen inside the command bodies, so `kernelagent --help` is instant.
COMMANDS = [
    ("kernelagent.cli.eval_cmd", "eval_command", "eval"),
    ("kernelagent.cli.optimize_cmd", "optimize", "optimize"),
    ("kernelagent.cli.bench_cmd", "bench", "bench"),
    ("kernelagent.cli.report_cmd", "report", "report"),
    ("kernelagent.cli.profile_cmd", "profile", "profile"),
    ("kernelagent.cli.plan_cmd", "plan", "plan"),
    ("kernelagent.cli.mcp_cmd", "mcp", "mcp"),
    ("kernelagent.cli.dataset_cmd", "dataset_app", "dataset"),
    ("kernelagent.cli.export_cmd", "export_app", "export"),
    ("kernelagent.cli.serve_cmd", "serve", "serve"),
    ("kernelagent.cli.ci_cmd", "verify", "verify"),
    ("kernelagent.cli.ci_cmd", "regenerate", "regenerate"),
    ("kernelagent.cli.ci_cmd", "init", "init"),
]


def _register() -> None:
    import importlib
    import importlib.util

    for module_name, attribute, command in COMMANDS:
        if importlib.util.find_spec(module_name) is None:
            continue  # a command whose module is not written yet
        target = getattr(importlib.import_module(module_name), attribute)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=command)
        else:
            app.command(command, cls=Command)(target)


_register()


def main() -> None:
    """Console entry point. kernelagent.cli.core.Group.main maps every outcome (a usage error,
    a UserError, Ctrl-C) to one line on stderr and a documented exit code."""
    try:
        app()
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            # After Ctrl-C everything worth keeping is written and said. Interpreter shutdown
            # would still join non-daemon threads (litellm's logging pool takes seconds), so
            # leave now: the user pressed Ctrl-C to get the prompt back.
            import os

            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(EXIT_INTERRUPTED)
        raise


def run_guarded(func, *args, **kwargs):
    """Run a command body, turning UserError into one line and exit 2 (also under CliRunner)."""
    try:
        return func(*args, **kwargs)
    except UserError as exc:
        from kernelagent.text import terminal_text

        typer.echo(terminal_text(f"error: {exc}"), err=True)
        raise typer.Exit(exc.exit_code) from None

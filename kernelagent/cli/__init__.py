"""The `kernelagent` command. Commands are thin: they resolve options and call the library.

Exit codes (documented in the README):
    0  success (eval: correct; optimize: correct and meets the target)
    1  the candidate is incorrect or failed; no correct kernel was found
    2  bad input or configuration (one clear line, never a traceback)
    3  optimize: correct, but short of the speed target
"""

from __future__ import annotations

import logging
import sys

import typer

from kernelagent import __version__
from kernelagent.errors import EXIT_USAGE, UserError

app = typer.Typer(
    name="kernelagent",
    help="Turn a PyTorch reference module into a verified, faster GPU kernel.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def setup_logging(verbose: bool) -> None:
    """Once per process, through rich, on stderr."""
    from rich.console import Console
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False)],
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


def _register() -> None:
    from kernelagent.cli.eval_cmd import eval_command

    app.command("eval")(eval_command)
    try:
        from kernelagent.cli.optimize_cmd import optimize
    except ImportError:  # pragma: no cover - optional while the agent is absent
        return
    app.command("optimize")(optimize)


_register()


def main() -> None:
    """Console entry point: a UserError becomes one line on stderr and exit code 2."""
    try:
        app(standalone_mode=True)
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    sys.exit(0)


def run_guarded(func, *args, **kwargs):
    """Run a command body, turning UserError into one line and exit 2 (also under CliRunner)."""
    try:
        return func(*args, **kwargs)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None

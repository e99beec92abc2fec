"""What every command shares: one-line errors, plain help that reads well at 80 columns,
and number types that refuse NaN and infinities.

Light on purpose (click and typer only): command modules import it at `kernelagent --help`.

- `Group.main` runs click in non-standalone mode and maps what comes out to the documented
  exit codes itself, so a usage error, a UserError and Ctrl-C each give one line on stderr
  (click's own handling prints a usage block, and turns Ctrl-C into a silent exit).
- Help is click's plain layout with our own records: usage names arguments as PROBLEM, not
  `{problem}`; options show a metavar saying what to pass (N, X, DIR, URL...), never `<bool>`;
  descriptions wrap, never cut (the command list included).
"""

from __future__ import annotations

import enum
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

try:  # typer >= 0.25 carries its own copy of click; its classes are the ones in play
    from typer import _click as click
except ImportError:  # pragma: no cover - older typer runs on the installed click
    import click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from kernelagent.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, UserError
from kernelagent.text import terminal_text


def finite(min: float | None = None, max: float | None = None, min_open: bool = False):
    """An option callback: the number must be finite (no nan, no inf) and within [min, max]
    ((min, max] with `min_open`). Range checks on floats let NaN through (every comparison
    with NaN is False), and `--rtol nan` would pass any kernel."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        number = float(value)
        if not math.isfinite(number):
            raise typer.BadParameter(f"{value} is not a finite number")
        if min is not None and (number < min or (min_open and number == min)):
            raise typer.BadParameter(f"{value:g} is out of range: it must be {'>' if min_open else '>='} {min:g}")
        if max is not None and number > max:
            raise typer.BadParameter(f"{value:g} is out of range: it must be <= {max:g}")
        return value

    return check


def folder(value: Any) -> Any:
    """An option callback: a folder to use or make (a cache), never a file or a path under one
    (`--cache-dir FILE` was accepted, and nothing was cached)."""
    if value is not None:
        from pathlib import Path

        for parent in [Path(value), *Path(value).parents]:
            if parent.exists() and not parent.is_dir():
                raise typer.BadParameter(f"{value} is a file, not a folder" if parent == Path(value)
                                         else f"{value}: {parent} is a file, not a folder")
    return value


# -- help ------------------------------------------------------------------------------
def _metavar(param: Any) -> str:
    """The option's metavar, else one derived from its type: N, X, PATH, a|b|c, TEXT."""
    if param.metavar:
        return param.metavar
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "|".join(str(m.value) for m in annotation)
    return {int: "N", float: "X", Path: "PATH"}.get(annotation, "TEXT")


def _default_text(param: Any) -> str | None:
    if not param.show_default or param.default is None or callable(param.default):
        return None
    value = param.default
    if param.is_flag:
        if param.secondary_opts:  # --timing/--no-timing: say which one is the default
            return param.opts[0] if value else param.secondary_opts[0]
        return None
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return str(value)


def option_record(param: Any) -> tuple[str, str]:
    names = click.formatting.join_options(param.opts)[0]
    if param.secondary_opts:
        names += " / " + click.formatting.join_options(param.secondary_opts)[0]
    if not param.is_flag and not getattr(param, "count", False):
        names += f" {_metavar(param)}"
    extra = []
    default = _default_text(param)
    if default is not None:
        extra.append(f"default: {default}")
    if param.envvar and isinstance(param.envvar, str):
        extra.append(f"env: {param.envvar}")
    text = (param.help or "").strip()
    if extra:
        text = f"{text}  [{'; '.join(extra)}]"
    return names, text


def argument_name(param: Any) -> str:
    return param.metavar or param.name.upper()


class _Help:
    """Help records built here (see the module docstring); mixed into both classes."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = argument_name(param)
                if param.nargs != 1 and not name.endswith("..."):  # RUN... is named so already
                    name += "..."
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            if isinstance(param, TyperArgument):
                help_text = (getattr(param, "help", None) or "").strip()
                args.append((argument_name(param), help_text + ("" if param.required else "  [optional]")))
            elif isinstance(param, TyperOption):
                opts.append(option_record(param))
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)


class Command(_Help, TyperCommand):
    pass


class Group(_Help, TyperGroup):
    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*_Help.collect_usage_pieces(self, ctx), self.subcommand_metavar]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            # The whole first paragraph: click's short help would cut it with "...".
            first = (cmd.help or "").strip().split("\n\n")[0]
            rows.append((name, " ".join(first.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra: Any) -> Any:
        """Run the command; every outcome leaves through sys.exit with a documented code."""
        _interrupt_reported[0] = False
        _PipeSafe.install()
        try:
            code = super().main(args=args, prog_name=prog_name or "kernelagent", complete_var=complete_var,
                                standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: its help, exit 0
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            code = 0
        except click.exceptions.ClickException as exc:
            hint = ""
            ctx = getattr(exc, "ctx", None)
            if isinstance(exc, click.exceptions.UsageError) and ctx is not None:
                hint = f" (see '{ctx.command_path} --help')"
            message = " ".join(terminal_text(exc.format_message()).split())
            click.echo(f"error: {message}{hint}", err=True)
            code = exc.exit_code
        except UserError as exc:  # it may quote a candidate's reason or a file's name
            click.echo(f"error: {' '.join(terminal_text(exc).split())}", err=True)
            code = exc.exit_code
        except (KeyboardInterrupt, *_ABORT):
            code = EXIT_INTERRUPTED
        except OSError as exc:
            import errno

            code = 1 if exc.errno == errno.EPIPE else _internal_error(exc)  # a closed pipe (`| head`) is fine
        except Exception as exc:  # noqa: BLE001 - a bug of ours: one line, the traceback in a file
            code = _internal_error(exc)
        if code == EXIT_INTERRUPTED and not _interrupt_reported[0]:
            # typer turns a KeyboardInterrupt inside a command into a silent exit 130.
            click.echo("interrupted", err=True)
        sys.exit(code if isinstance(code, int) else 0)


_interrupt_reported = [False]


class _PipeSafe:
    """sys.stdout that outlives its reader: once the pipe is closed (`kernelagent eval ... | head
    -1`), what follows goes to /dev/null and the command ends with its own exit code (a pass is 0,
    even under `set -o pipefail`), never 1 for the closed pipe nor a BrokenPipeError at exit."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    @classmethod
    def install(cls) -> None:
        stream = sys.stdout
        try:
            stream.fileno()  # a real file or pipe; not CliRunner's buffer
        except (AttributeError, OSError, ValueError):
            return
        if not isinstance(stream, cls):
            sys.stdout = cls(stream)

    def _closed(self) -> None:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # the buffered rest (and Python's flush at exit) go nowhere
        os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
# click's Abort (Ctrl-C at a prompt). typer 0.29's own copy of click has none: naming it there
# raised AttributeError while handling any other exception, hiding the real one.
_ABORT: tuple[type[BaseException], ...] = tuple(
    x for x in (getattr(click.exceptions, "Abort", None),) if isinstance(x, type))


def _internal_error(exc: BaseException) -> int:
    """An exception nobody expected: one line on stderr naming it and the file that holds the
    whole traceback (EXIT_INTERNAL). Never a raw traceback on the terminal."""
    import tempfile
    import traceback

    where = "(not written)"
    try:
        with tempfile.NamedTemporaryFile("w", prefix="kernelagent-crash-", suffix=".txt", delete=False,
                                         encoding="utf-8", errors="backslashreplace") as handle:
            handle.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            where = handle.name
    except OSError:
        pass
    message = " ".join(terminal_text(exc).split())[:300]
    click.echo(f"error: internal error, {type(exc).__name__}: {message} (full traceback: {where}; "
               "please report it)", err=True)
    return EXIT_INTERNAL


def interrupted(message: str) -> typer.Exit:
    """Say what an interrupted command kept (one line on stderr); raise the result (exit 130)."""
    _interrupt_reported[0] = True
    typer.echo(message, err=True)
    return typer.Exit(EXIT_INTERRUPTED)


def typer_app(**kwargs: Any) -> typer.Typer:
    """A Typer with our group class and plain help."""
    return typer.Typer(cls=Group, rich_markup_mode=None, add_completion=False,
                       pretty_exceptions_enable=False, **kwargs)


def help_or_exit(ctx: typer.Context) -> None:
    """Bare `kernelagent` / `kernelagent dataset`: print the help and exit 0."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


# -- options shared by eval, bench, optimize, verify and profile ------------------------------
# The Inductor modes of the torch.compile baseline, defined once (issue 13). The list of valid
# modes lives in harness/config.py (INDUCTOR_MODES), which imports no torch.
InductorModesOpt = Annotated[Optional[str], typer.Option(
    "--inductor-modes", metavar="MODES",
    help="torch.compile modes to time the Inductor baseline in, comma-separated: default, "
         "max-autotune-no-cudagraphs, reduce-overhead (CUDA graphs), max-autotune. default is always timed "
         "(targets and fast_p compare against it); the others are reported by name (compile:MODE).",
    show_default=False)]
MaxAutotuneOpt = Annotated[bool, typer.Option(
    "--max-autotune", help="Alias of --inductor-modes default,max-autotune-no-cudagraphs.")]
# Jobs per device (issue 23): the harness server overlaps their host work and gives each timed
# phase the device alone; 0 lets the server choose from the host's CPUs and the device's memory.
JobsPerGpuOpt = Annotated[int, typer.Option(
    "--jobs-per-gpu", min=0, max=8, metavar="N",
    help="Evaluations each device's harness runs at once: compile and checks overlap, every timed loop "
         "has the device alone. 0: chosen from the host's CPUs and the device's free memory (printed).")]

# The warm harness (issue 59, harness/caller/daemon.py): the default of the commands that judge
# for a person (eval, profile, verify, regenerate, mcp; bench has its own option, one per device).
DaemonOpt = Annotated[Optional[bool], typer.Option(
    "--daemon/--no-daemon",
    help="Use this user's warm harness (started now if none answers; it ends after 10 idle minutes), found "
         "through a private socket, instead of a server for this command alone: a second command skips the "
         "server's start. Default: on, unless $KERNELAGENT_DAEMON=0 (--no-daemon: a private server, as before).",
    show_default=False)]


def warm_harness(flag: bool | None) -> bool:
    """`--daemon/--no-daemon` resolved for a command of the CLI: the flag, else
    KERNELAGENT_DAEMON, else on (the library's Evaluator stays off unless KERNELAGENT_DAEMON=1)."""
    from kernelagent.harness.caller import daemon

    return daemon.wanted(flag, cli=True)


# The search (issue 26), shared by optimize, bench (agent mode) and ci regenerate.
StrategyOpt = Annotated[str, typer.Option(
    "--strategy", metavar="single|best-of-n|beam|evolve",
    help="single: one conversation, one candidate per turn. best-of-n: N conversations sharing the budget. "
         "beam: each round, N children of the best K so far. evolve: a population; mutate or combine the best.")]
SamplesOpt = Annotated[int, typer.Option(
    "--samples", min=1, metavar="N",
    help="Model calls per round, their candidates evaluated concurrently; above 1 needs a search strategy.")]
ModelConcurrencyOpt = Annotated[Optional[int], typer.Option(
    "--model-concurrency", min=1, metavar="N", help="Model calls at once within a round (default: --samples).",
    show_default=False)]


def inductor_modes(value: str | None, max_autotune: bool = False) -> tuple[str, ...]:
    """EvalConfig.compile_modes from --inductor-modes and --max-autotune: "default" first, then
    the others in the order given, without repeats. An unknown mode is a UserError (exit 2)."""
    from kernelagent.harness.config import INDUCTOR_MODES

    asked = [m.strip() for m in (value or "").split(",") if m.strip()]
    if value is not None and not asked:
        raise UserError(f"--inductor-modes is empty (use some of {', '.join(INDUCTOR_MODES)})")
    for mode in asked:
        if mode not in INDUCTOR_MODES:
            raise UserError(f"--inductor-modes: unknown mode {mode!r} (use {', '.join(INDUCTOR_MODES)})")
    if max_autotune:
        asked.append("max-autotune-no-cudagraphs")
    modes = ["default"]
    for mode in asked:
        if mode not in modes:
            modes.append(mode)
    return tuple(modes)


# -- stage limits (eval, bench, optimize, verify): defined once, used by each command ------------
_STAGES = ("start", "load", "compile", "correctness", "timing", "baselines", "cuda_build")


def _check_scale(value: Any) -> Any:
    return finite(0, min_open=True)(value)


def _check_stage_items(values: Any) -> Any:
    """STAGE=SECONDS items: a known stage, a finite number of seconds > 0."""
    if not values:
        return values
    for item in values:
        name, sep, seconds = str(item).partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r} is not STAGE=SECONDS (e.g. compile=300)")
        if name.strip() not in _STAGES:
            raise typer.BadParameter(f"unknown stage {name.strip()!r} (stages: {', '.join(_STAGES)})")
        try:
            number = float(seconds)
        except ValueError:
            raise typer.BadParameter(f"{seconds!r} in {item!r} is not a number of seconds") from None
        if not math.isfinite(number) or number <= 0:
            raise typer.BadParameter(f"{item!r}: the seconds must be a finite number > 0")
    return values


TimeoutScaleOpt = typer.Option(
    "--timeout-scale", metavar="X", callback=_check_scale, show_default=False,
    help="Multiply every stage's time limit by X (> 0), e.g. 4 for slow kernels under the CPU interpreter.")
StageTimeoutOpt = typer.Option(
    "--stage-timeout", metavar="STAGE=SECONDS", callback=_check_stage_items, show_default=False,
    help=f"Set one stage's limit in seconds (repeatable; after --timeout-scale). Stages: {', '.join(_STAGES)}.")


def stage_timeouts(scale: float | None, items: list[str] | None) -> dict[str, float] | None:
    """The StageTimeouts fields (a dict, as EvalConfig takes them) for --timeout-scale and
    --stage-timeout; None when neither was given (the defaults stand)."""
    if scale is None and not items:
        return None
    from kernelagent.harness.config import StageTimeouts

    stages = {}
    for item in items or []:
        name, _, seconds = str(item).partition("=")
        stages[name.strip()] = float(seconds)
    return dataclasses_asdict(StageTimeouts().scaled(1.0 if scale is None else float(scale), **stages))


def dataclasses_asdict(value: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(value)

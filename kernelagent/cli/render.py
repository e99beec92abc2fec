"""Rich rendering of harness results for people.

Every string of the result may be a candidate's (its reason, trial and flag messages, and
whatever it forged into the other fields): each goes through kernelagent.text.terminal_text,
with rich markup escaped wherever rich parses markup (console.print with markup, table cells)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kernelagent.harness.result import EvalResult, Status
from kernelagent.text import terminal_text

STATUS_STYLE = {Status.CORRECT: "bold green", Status.COMPILED: "green", Status.INCORRECT: "bold red",
                Status.REJECTED: "bold magenta", Status.TIMEOUT: "bold yellow", Status.CRASHED: "bold red",
                Status.BAD_PROBLEM: "bold red"}


def _m(text: object) -> str:
    """Text for a place where rich parses markup."""
    return terminal_text(text, markup=True)


# EvalConfig fields the harness's messages named before issue 56 (results kept in a store or a
# trajectory), as the options that set them (`kernelagent eval`).
OPTION_NAMES = {"pass compile_baseline_on_cpu to force": "pass --compile-baseline-on-cpu to time it anyway"}


def options_named(text: str) -> str:
    for field, option in OPTION_NAMES.items():
        text = text.replace(field, option)
    return text


def _print_rows(console: Console, rows: list[tuple[str, str]]) -> None:
    """Label/value rows: a table that wraps to the terminal, or, in a pipe or a file, plain lines
    with no padding after the value and no wrapping (a table pads every line to 80 columns)."""
    if console.is_terminal:
        table = Table(show_header=False, box=None, pad_edge=False)
        for label, value in rows:
            table.add_row(label, value)
        console.print(table)
        return
    from rich.text import Text

    width = max((len(Text.from_markup(label).plain) for label, _ in rows), default=0)
    for label, value in rows:
        pad = " " * (width - len(Text.from_markup(label).plain) + 2)
        console.print(f"{label}{pad}{value}", soft_wrap=True)


def render_result(result: EvalResult, console: Console | None = None, *, stages: bool = False) -> None:
    """The verdict and its table; `stages`: also the harness's seconds per stage (eval -v)."""
    console = console or Console()
    style = STATUS_STYLE.get(result.status, "bold")
    verdict = "PASS" if result.passed else "FAIL"
    console.print(f"[{style}]{verdict}: {_m(result.status)}[/]" + (f" (stage: {_m(result.stage)})" if result.stage else ""))
    if result.reason:
        console.print(terminal_text(result.reason), markup=False, highlight=False)
    rows: list[tuple[str, str]] = []
    add_row = lambda label, value: rows.append((label, value))  # noqa: E731
    smoke = (result.derived or {}).get("smoke")
    sizes = f" ({', '.join(f'{k}={v}' for k, v in smoke.items())})" if smoke else ""
    add_row("device", _m(f"{result.device or '?'}  inputs: {result.input_set}{sizes}"))
    add_row("compiled", "yes" if result.compiled else "no")
    passed, checks = sum(t.passed for t in result.trials), len(result.trials)
    if result.correct:
        correct = f"yes ({passed}/{checks} checks)"
    elif checks and passed == checks:  # every output matched, and something else decided (a flag, a stage)
        correct = f"outputs matched ({passed}/{checks} checks), but the verdict is {result.status}: see below"
    else:
        correct = f"no ({passed}/{checks} checks)"
    add_row("correct", _m(correct))
    for name, timing in result.timings.items():
        note = "" if timing.meaningful else "  (not meaningful: CPU/interpreter)"
        empty = f", empty call {timing.empty_call_ms:.4f} ms" if timing.empty_call_ms is not None else ""
        clocks = (f", SM clock {timing.clocks_mhz[0]:.0f}->{timing.clocks_mhz[1]:.0f} MHz"
                  if len(timing.clocks_mhz) == 2 else "")
        add_row(_m(f"time {name}"), f"{timing.median_ms:.4f} ms median, IQR {timing.iqr_ms:.4f}, "
                                          f"{timing.reps} reps{empty}{clocks}{note}")
    meaningful = all(t.meaningful for t in result.timings.values())
    for name, value in result.speedups.items():
        bounds = result.speedup_intervals.get(name)
        interval = f" [{bounds[0]:.3f}, {bounds[1]:.3f}] (95%)" if bounds and len(bounds) == 2 else ""
        add_row(_m(f"speedup vs {name}"),
                      _m(f"{value:.3f}x{interval}") + ("" if meaningful else "  (not meaningful)"))
    clock = result.per_call
    if clock is not None:  # the two clocks (issue 58): the device's and the wall's, with the host's share
        add_row("per call", _m(f"device {clock.device_ms:.4f} ms ({clock.source}), wall {clock.wall_ms:.4f} ms, "
                               f"host share {100 * clock.host_share:.0f}%"))
    for name, value in result.speedups_device.items():
        add_row(_m(f"speedup vs {name} (device)"), _m(f"{value:.3f}x"))
    if result.speedups:
        add_row("speedup clock", _m(f"{result.speedup_clock} (start to end event, host launches included)"
                                    if result.speedup_clock == "wall" else result.speedup_clock))
    if result.baselines_cached:
        add_row("baselines", "from cache")
    if any(name != "candidate" for name in result.timings) and result.numerics:
        add_row("numerics", "TF32 off in every baseline" if result.numerics.get("tf32") is False
                      else _m(result.numerics.get("note", "")))
    _print_rows(console, rows)
    for trial in result.trials:
        if not trial.passed:
            console.print(f"[red]{_m(trial.name)}[/] (seed {_m(trial.seed)}): {_m(trial.message)}", highlight=False)
    for flag in result.flags:
        label = {"reject": "[magenta]rejected[/]", "review": "[yellow]review[/]"}.get(flag.severity, "[dim]note[/]")
        console.print(f"{label} {_m('[' + str(flag.kind) + ']')} {_m(options_named(str(flag.message)))}",
                      highlight=False)
    secs = result.stage_seconds
    if secs and stages:
        console.print("[dim]" + "  ".join(f"{_m(k)} {v:.2f}s" for k, v in secs.items()) + "[/]", highlight=False,
                      soft_wrap=not console.is_terminal)

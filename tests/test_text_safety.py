"""Text a candidate wrote reaches each output valid for its format (issue 41, section 4): the JUnit
file parses, the HTML reports carry no markup of the candidate's, the Markdown step summary keeps
its table, and the terminal gets no escape sequence and no rich markup of the candidate's. The
sanitisers are kernelagent/text.py; every test here feeds one hostile string through a writer
and checks what it wrote. No harness starts: results are built directly."""

from __future__ import annotations

import io
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from kernelagent.harness.result import EvalResult, Flag, Status, TrialResult

# What a hostile candidate logs or raises: noncharacters, C0 controls, a lone surrogate, a title
# change (OSC 0), a screen erase (CSI 2J), rich markup, HTML, a Markdown link and a table breaker.
C0 = "".join(chr(c) for c in range(0x20))
HOSTILE = ("boom \ufffe\uffff " + C0 + " tail \ud800 \x1b]0;pwned title\x07 \x1b[2J \x9b31m "
           "[bold red]styled[/] <script>alert(1)</script> [click](http://evil.example) a|b\nc")
# The readable part, which every format keeps.
READABLE = ("boom", "tail", "alert(1)", "a|b", "styled")
FORBIDDEN = ["\ufffe", "\uffff", "\ud800", "\x1b", "\x9b", "\x07", "\x00", "pwned title"]


def hostile_result(text: str = HOSTILE) -> EvalResult:
    return EvalResult(status=Status.INCORRECT, reason=text, compiled=True, stage=text, device=text,
                      trials=[TrialResult(name=text, seed=7, passed=False, message=text)],
                      flags=[Flag(kind=text, message=text, severity="review")], stage_seconds={text: 1.0},
                      log="line one\n" + text + "\nlast line", problem="problems/p.py",
                      problem_sha256="a" * 64, candidate_sha256="b" * 64)


def assert_clean(text: str, *, allow_newlines: bool = True) -> None:
    for bad in FORBIDDEN:
        assert bad not in text, (bad, text)
    controls = {c for c in text if ord(c) < 0x20 and c not in ("\t\n" if allow_newlines else "")}
    assert not controls, controls
    text.encode("utf-8")  # strict: no lone surrogate


def verify_report(tmp_path: Path, name: str = "k`ern|el <b>"):
    from kernelagent.ci.manifest import KernelEntry
    from kernelagent.ci.verify import VerifyReport, check_kernel

    entry = KernelEntry(name=name, problem=tmp_path / "p.py", kernel=tmp_path / "k.py", problem_rel="problems/p.py",
                        kernel_rel="kernels/k\ufffe.py")
    check = check_kernel(entry, hostile_result(), None, environment={"cuda": False}, seconds=1.5)
    assert check.failures and "boom" in check.message()
    return VerifyReport(manifest=tmp_path / "kernelagent.toml", lock_path=tmp_path / "kernelagent.lock.json",
                        checks=[check], environment={"cuda": False, "torch": "2.x\uffff"}, evaluated=1, reused=0,
                        lock_written=False, wall_s=2.0)


# -- XML: the JUnit file of `kernelagent verify --junit` ------------------------------------------
def test_junit_with_hostile_text_parses_and_keeps_the_message(tmp_path):
    from kernelagent.ci import outputs

    path = tmp_path / "junit.xml"
    path.write_text(outputs.junit_xml(verify_report(tmp_path)), encoding="utf-8")  # as verify writes it
    root = ET.parse(path).getroot()
    case = root.find("testsuite/testcase")
    failure = case.find("failure")
    for text in (case.get("name"), case.get("file"), failure.get("message"), failure.text,
                 case.find("system-out").text):
        assert_clean(text)
    assert case.get("name") == "k`ern|el <b>"  # ElementTree escaped it; the parser gives it back
    for piece in READABLE[:-1] + ("<script>alert(1)</script>", "[bold red]styled[/]"):
        assert piece in failure.get("message") and piece in failure.text
    assert "line one" in case.find("system-out").text and "last line" in case.find("system-out").text


# -- Markdown: the GitHub step summary ------------------------------------------------------------
def test_markdown_summary_keeps_its_table_and_carries_no_html(tmp_path):
    from markdown_it import MarkdownIt

    from kernelagent.ci import outputs

    text = outputs.markdown(verify_report(tmp_path))
    assert_clean(text)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == 3  # header, rule, the one kernel: the candidate's newline did not split it
    assert all(len(re.findall(r"(?<!\\)\|", row)) == 6 for row in rows), rows  # five cells each
    assert "<script>" not in text  # (the name's "<b>" stays in its code span, where it is literal)
    html = MarkdownIt("commonmark").enable("table").render(text)  # as GitHub renders the summary
    assert "<script" not in html and "<a " not in html and "<b>" not in html and "<strong" not in html
    cells = re.findall(r"<td>(.*?)</td>", html, re.S)
    assert len(cells) == 5, html
    assert "k'ern|el &lt;b&gt;" in cells[0]  # the name in its code span, backtick and pipe defused
    for piece in ("boom", "tail", "alert(1)", "a|b c", "[bold red]styled[/]", "[click](http://evil.example)"):
        assert piece in cells[4], (piece, cells[4])


# -- HTML: the bench report and the whole-model report --------------------------------------------
def test_bench_report_html_has_no_markup_or_controls_of_the_candidates():
    from kernelagent.bench import metrics as M
    from kernelagent.bench.report import problems_csv, render_html

    records = [{"key": "level1/" + HOSTILE, "level": "level1", "name": HOSTILE, "status": HOSTILE, "compiled": True,
                "correct": False, "samples": 1, "correct_samples": 0, "reason": HOSTILE, "wall_s": 1.0}]
    data = {"run": {"id": "run-1", "mode": "candidates", "status": "finished", "created": 0, "updated": 0,
                    "wall_s": 1.0, "sessions": 1, "fingerprint": {"cuda": False, "torch": HOSTILE},
                    "spec": {"candidates": "c", "root": "r"}, "out_dir": "o"},
            "records": records, "pending": [], "metrics": M.compute(records), "store": "s",
            "evaluations": {"performed": 1, "reused": 0, "attempts": 1}}
    page = render_html(data)
    assert_clean(page)
    assert page.count("<script>") == 1  # the report's own sorting script, nothing else
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "tail" in page
    csv_text = problems_csv(records)
    assert_clean(csv_text)
    assert "alert(1)" in csv_text


def test_whole_model_report_html_has_no_markup_or_controls_of_the_candidates():
    from kernelagent.orchestrate.whole_report import render_html

    summary = {"problem": "models/m.py", "verdict": HOSTILE, "spliced": [HOSTILE], "e2e_speedup": None,
               "reason": HOSTILE, "model": HOSTILE,
               "regions": [{"region": "r0", "kind": "matmul", "ops": HOSTILE, "share": 0.5, "status": "left out",
                            "why": "spliced alone, the model is incorrect: " + HOSTILE}]}
    page = render_html(summary)
    assert_clean(page)
    assert page.count("<script") == 1  # the report's own sorting script, nothing else
    assert "&lt;script&gt;alert(1)" in page and "tail" in page


# -- the terminal ---------------------------------------------------------------------------------
def plain_console() -> Console:
    """Captures what a terminal would get, without colours of rich's own (so any ESC is the candidate's)."""
    return Console(file=io.StringIO(), width=400, color_system=None, force_terminal=False)


def test_eval_rendering_sends_no_escape_sequence_or_markup_to_the_terminal():
    from kernelagent.cli.render import render_result

    console = plain_console()
    render_result(hostile_result(), console)  # an unescaped "[/]" would raise MarkupError here
    out = console.file.getvalue()
    assert_clean(out)
    # The markup is shown as text, never applied: reason, stage, device, trial, flag kind and message.
    assert out.count("[bold red]styled[/]") >= 6, out
    for piece in READABLE:
        assert piece in out


def test_verify_lines_send_no_escape_sequence_to_the_terminal(tmp_path):
    from kernelagent.ci import outputs

    report = verify_report(tmp_path, name="relu\x1b[2J")
    lines = [outputs.progress_line(report.checks[0]), *outputs.console_lines(report)]
    for line in lines:
        assert_clean(line)
    assert "relu" in lines[0] and "boom" in lines[0] and "alert(1)" in lines[0]


def test_log_records_reach_the_terminal_without_escape_sequences():
    from kernelagent.cli import log_handler

    console = plain_console()
    logger = logging.getLogger("kernelagent.test_text_safety")
    handler = log_handler(console)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    # Only our handler sees the records: pytest's log capture would carry the lone surrogate into
    # its report, which pytest-xdist cannot send between processes.
    logger.propagate = False
    try:
        logger.warning("the candidate said: %s", HOSTILE)
        try:
            raise RuntimeError(HOSTILE)
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    out = console.file.getvalue()
    assert_clean(out)
    assert "the candidate said: boom" in out and "[bold red]styled[/]" in out and "RuntimeError" in out


def test_error_lines_of_commands_send_no_escape_sequence_to_the_terminal():
    import typer
    from typer.testing import CliRunner

    from kernelagent.cli.core import Command, typer_app
    from kernelagent.errors import UserError

    app = typer_app(name="t")

    @app.callback()
    def _root() -> None:
        pass

    @app.command("boom", cls=Command)
    def boom() -> None:
        raise UserError(f"bad problem file p.py: {HOSTILE}")

    result = CliRunner().invoke(app, ["boom"])
    assert result.exit_code == 2 and isinstance(app, typer.Typer)
    assert_clean(result.stderr)
    assert result.stderr.startswith("error: bad problem file p.py: boom") and "alert(1)" in result.stderr


@pytest.mark.parametrize("live", [False, True])
def test_bench_progress_sends_no_escape_sequence_or_markup_to_the_terminal(live):
    from kernelagent.bench.progress import BenchProgress

    progress = BenchProgress(console=plain_console(), live=False)
    progress.begin("run-1", "candidates", 2, 0, 0, ["cpu"], 1, resumed=False)
    progress.eval_started("cpu", "level1/" + HOSTILE)
    progress.agent_started("level2/" + HOSTILE)
    progress.problem_finished("level1/" + HOSTILE, {"correct": False, "status": HOSTILE})
    out = progress.console.file.getvalue()  # the plain lines (off a terminal)
    if live:  # the live panel: its table cells and lines, drawn once
        console = plain_console()
        console.print(progress.render())  # a cell parsed as markup would raise on "[click]" or apply "[bold red]"
        out = console.file.getvalue()
    assert_clean(out)
    assert out.count("[bold red]styled[/]") >= (3 if live else 1) and "alert(1)" in out


@pytest.mark.parametrize("live", [False, True])
def test_optimize_live_view_sends_no_escape_sequence_or_markup_to_the_terminal(live):
    from kernelagent.agent.budget import Budget
    from kernelagent.agent.live import LiveView

    view = LiveView(Budget(), console=plain_console(), live=False)
    view("start", problem=HOSTILE, model="m", mode="auto", device="cpu", out="o")
    view("stop", reason="error", detail=HOSTILE)
    out = view.console.file.getvalue()  # the plain lines (off a terminal)
    if live:  # the live panel: its title, table cells and event lines, drawn once
        view.last_tool = view.best = view.search = HOSTILE
        console = plain_console()
        console.print(view.render())
        out = console.file.getvalue()
    assert_clean(out)
    assert out.count("[bold red]styled[/]") >= (4 if live else 2) and "alert(1)" in out


# -- the sanitisers themselves --------------------------------------------------------------------
def test_each_sanitiser_keeps_ordinary_text_as_it_is():
    from kernelagent.text import html_text, markdown_text, terminal_text, xml_text

    plain = "correct: 1.52x vs TorchInductor (lower bound 1.10x)\n\tüñí ✅"
    assert xml_text(plain) == terminal_text(plain) == plain
    assert html_text("a < b & c") == "a &lt; b &amp; c"
    assert markdown_text("a | b\nc <i>") == "a \\| b c &lt;i&gt;"
    assert terminal_text("[red]x[/]", markup=True) == "\\[red]x\\[/]"

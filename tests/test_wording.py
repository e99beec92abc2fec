"""The wording a newcomer reads (issue 43): counts agree with their nouns, a note names an option
that exists, and the README tells how to start from nothing and how to try a run without a key."""

from __future__ import annotations

import io
import re

from rich.console import Console
from typer.testing import CliRunner

from kernelagent.cli import app
from tests.conftest import CANDIDATES, REPO

ENV = {"COLUMNS": "200", "CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_MODEL": None}


def test_one_kernel_is_one_kernel(tmp_path):
    problems, kernels = tmp_path / "problems", tmp_path / "kernels"
    problems.mkdir()
    kernels.mkdir()
    (problems / "relu.py").write_text((CANDIDATES / "relu_problem.py").read_text())
    (kernels / "relu.py").write_text((CANDIDATES / "relu_good.py").read_text())
    result = CliRunner().invoke(app, ["init", str(tmp_path)], env=ENV)
    assert result.exit_code == 0, result.output
    assert ": 1 kernel; check it with `kernelagent verify" in result.stdout, result.stdout
    assert "1 kernels" not in result.stdout


def test_plural():
    from kernelagent.text import plural

    assert [plural(n, "kernel") for n in (0, 1, 2)] == ["0 kernels", "1 kernel", "2 kernels"]
    assert plural(1, "search run") == "1 search run" and plural(3, "entry", "entries") == "3 entries"


def test_the_skipped_baseline_note_names_an_option_that_exists():
    """The harness says "pass compile_baseline_on_cpu to force", an EvalConfig field: the CLI shows
    the option that sets it, and `eval` has that option."""
    from kernelagent.cli.render import render_result
    from kernelagent.harness.result import EvalResult

    result = EvalResult.from_dict({"status": "correct", "passed": True, "compiled": True, "correct": True, "flags": [
        {"kind": "baseline-skipped", "severity": "info",
         "message": "torch.compile baseline skipped on the CPU (pass compile_baseline_on_cpu to force)"}]})
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_result(result, console)
    out = console.file.getvalue()
    assert "pass --compile-baseline-on-cpu to time it anyway" in out and "compile_baseline_on_cpu" not in out
    helped = CliRunner().invoke(app, ["eval", "--help"], env=ENV)
    assert "--compile-baseline-on-cpu" in helped.stdout


def test_the_readme_starts_from_nothing_and_runs_without_a_key():
    text = (REPO / "README.md").read_text()
    assert re.search(r"git clone \S+", text) and "python3 -m venv .venv" in text
    assert "Python ≥ 3.10" in text or "Python >= 3.10" in text
    assert "--model scripted:" in text
    # the two set-up commands stay as they are (tests/test_docs.py checks them too)
    assert ("pip install torch==2.13.0 && pip install -e '.[agent]' && kernelagent eval benchmarks/level1/1_relu.py "
            "benchmarks/solutions/level1/1_relu.py") in text
    assert "pip install torch==2.13.0 && pip install -e '.[test,rl]' && python -m pytest -q -n auto" in text


def test_a_rejected_result_whose_outputs_all_matched_does_not_read_correct_no():
    """The issue saw `correct  no (11/11 checks)` on a rejected result."""
    from kernelagent.cli.render import render_result
    from kernelagent.harness.result import EvalResult

    trials = [{"name": f"trial {i}", "passed": True, "seed": i, "message": ""} for i in range(11)]
    result = EvalResult.from_dict({"status": "rejected", "passed": False, "compiled": True, "correct": False,
                                   "trials": trials, "flags": [{"kind": "no-custom-kernel", "severity": "reject",
                                                                "message": "PyTorch did the work"}]})
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_result(result, console)
    out = console.file.getvalue()
    assert "no (11/11 checks)" not in out
    assert "outputs matched (11/11 checks), but the verdict is rejected: see below" in out


def test_eval_on_the_command_line_says_outputs_matched_and_names_the_option(tmp_path):
    """The two fixes above, as a user meets them: `kernelagent eval` of a candidate that computes the
    right answer with PyTorch behind a do-nothing kernel (rejected, every check matched), and of a good one on the CPU
    (the torch.compile baseline is skipped there, and the note names the option that times it)."""
    env = {**ENV, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}
    problem = str(CANDIDATES / "relu_problem.py")
    cheat = CliRunner().invoke(app, ["eval", problem, str(REPO / "tests" / "adversarial" / "c01_dummy_kernel_disguised_torch.py"),
                                     "--device", "cpu", "--trials", "1", "--no-timing"], env=env)
    assert cheat.exit_code == 1, cheat.output
    text = " ".join(cheat.stdout.split())
    matched = re.search(r"correct outputs matched \((\d+)/(\d+) checks\), but the verdict is rejected: see below", text)
    assert matched and matched.group(1) == matched.group(2), cheat.stdout
    assert not re.search(r"correct no \(\d+/\d+ checks\)", text)
    good = CliRunner().invoke(app, ["eval", problem, str(CANDIDATES / "relu_good.py"), "--device", "cpu",
                                    "--trials", "1"], env=env)
    assert good.exit_code == 0, good.output
    said = " ".join(good.output.split())
    assert "pass --compile-baseline-on-cpu to time it anyway" in said and "compile_baseline_on_cpu" not in said

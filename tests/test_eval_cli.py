"""`kernelagent eval`, in-process, at a fixed terminal width."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from tests.conftest import CANDIDATES

runner = CliRunner()
PROBLEM = str(CANDIDATES / "relu_problem.py")
FAST = ["--trials", "2"]


def invoke(*args: str, cache_dir=None):
    extra = ["--cache-dir", str(cache_dir)] if cache_dir else []
    return runner.invoke(app, ["eval", *args, *extra], env={"COLUMNS": "120", "TERM": "dumb"})


def test_correct_candidate_exits_0_with_summary(cache_dir):
    result = invoke(PROBLEM, str(CANDIDATES / "relu_good.py"), *FAST, cache_dir=cache_dir)
    assert result.exit_code == 0, result.output
    assert "PASS: correct" in result.output
    assert "not meaningful" in result.output  # CPU timings are labelled


def test_wrong_candidate_exits_1_and_says_why(cache_dir):
    result = invoke(PROBLEM, str(CANDIDATES / "relu_wrong.py"), *FAST, cache_dir=cache_dir)
    assert result.exit_code == 1
    assert "FAIL: incorrect" in result.output and "first at [" in result.output


def test_json_output_is_one_object_with_fingerprint_and_seeds(cache_dir):
    result = invoke(PROBLEM, str(CANDIDATES / "relu_good.py"), *FAST, "--json", cache_dir=cache_dir)
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["status"] == "correct" and data["format_version"] == 2
    assert {"python", "torch", "triton"} <= set(data["fingerprint"])
    # Secret by default: drawn by the server, reported afterwards.
    seeds = data["seeds"]
    assert seeds["secret"] is True and seeds["trials"] == [seeds["base"], seeds["base"] + 1]
    fixed = json.loads(invoke(PROBLEM, str(CANDIDATES / "relu_good.py"), *FAST, "--seed", "42", "--json",
                              cache_dir=cache_dir).stdout)["seeds"]
    assert fixed["secret"] is False and fixed["trials"] == [42, 43]
    assert "log" in data and "isolation" in data


def test_candidate_crash_is_exit_1_not_a_traceback(cache_dir):
    result = invoke(PROBLEM, str(CANDIDATES / "segfaults.py"), *FAST, cache_dir=cache_dir)
    assert result.exit_code == 1
    assert "SIGSEGV" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args, message", [
    (["missing_problem.py", str(CANDIDATES / "relu_good.py")], "problem file not found"),
    ([str(CANDIDATES / "bad_problem_no_model.py"), str(CANDIDATES / "relu_good.py")], "missing Model"),
    ([PROBLEM, "missing_candidate.py"], "candidate file not found"),
    ([PROBLEM, str(CANDIDATES / "relu_good.py"), "--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N"),
    ([PROBLEM, str(CANDIDATES / "relu_good.py"), "--isolation", "docker"], "--isolation"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_problem_with_syntax_error_exit_2(tmp_path):
    bad = tmp_path / "problem.py"
    bad.write_text("class Model(:\n    pass\n")
    result = invoke(str(bad), str(CANDIDATES / "relu_good.py"))
    assert result.exit_code == 2 and "syntax error at line 1" in result.output


def test_problem_failing_at_run_time_exit_2(cache_dir):
    result = invoke(str(CANDIDATES / "bad_problem_raises.py"), str(CANDIDATES / "relu_good.py"), *FAST,
                    cache_dir=cache_dir)
    assert result.exit_code == 2 and "broken get_inputs" in result.output


def test_unknown_flag_exit_2():
    result = invoke(PROBLEM, str(CANDIDATES / "relu_good.py"), "--no-such-flag")
    assert result.exit_code == 2


def test_every_cli_option_declares_its_name():
    """typer 0.27 (the GPU machine's) names an option declared only by its metavar after the
    metavar: `eval --device` was refused there (its help said `--DEVICE`). Every option names
    itself explicitly."""
    import re

    from tests.conftest import REPO

    undeclared = []
    for path in sorted((REPO / "kernelagent" / "cli").glob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"typer\.Option\((?!\s*[\"'])[^\n]*metavar=", line):
                undeclared.append(f"{path.name}:{number}")
    assert not undeclared, undeclared

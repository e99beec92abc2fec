"""`kernelagent optimize`, in process (typer's CliRunner, fixed width), through the real
litellm client against the fake OpenAI server and the real harness on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from tests.fake_openai_server import FakeOpenAIServer, error, text, tool
from tests.test_agent import GOOD, RELU_PROBLEM, SYNTAX_ERROR, WRONG, block

WIDTH_ENV = {"COLUMNS": "120", "KERNELAGENT_MODEL": None, "KERNELAGENT_API_BASE": None,
             "KERNELAGENT_API_KEY": None}


@pytest.fixture
def problem(tmp_path) -> Path:
    path = tmp_path / "19_ReLU.py"
    path.write_text(RELU_PROBLEM)
    return path


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["optimize", *args], env={**WIDTH_ENV, **(env or {})},
                              catch_exceptions=False)


def model_args(server) -> list[str]:
    return ["--model", "openai/fake-coder", "--api-base", server.url, "--retry-backoff", "0.01",
            "--model-timeout", "20"]


def test_tool_calling_run_succeeds(server, problem, tmp_path):
    """Required 1: compile error, then a wrong kernel, then a correct one -> exit 0."""
    server.add(tool("compile", {"code": SYNTAX_ERROR}), tool("run_tests", {"code": WRONG}),
               error(429, retry_after="0"), tool("submit", {"code": GOOD}))
    out = tmp_path / "run"
    result = invoke(str(problem), *model_args(server), "--mode", "tools", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "kernel.py").read_text() == GOOD
    lines = result.output.splitlines()
    assert "correct kernel, meets the target (not measurable on CPU)" in lines[-1]
    assert any("compile -> compile_error" in line for line in lines)
    assert any("run_tests -> incorrect" in line for line in lines)
    assert any("retry 1/6" in line for line in lines)  # the 429, logged and retried
    traj = json.loads((out / "trajectory.json").read_text())
    assert traj["status"] == "finished" and len(traj["steps"]) == 3
    assert [o["verdict"] for s in traj["steps"] for o in s["observations"]] == [
        "compile_error", "incorrect", "correct"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["outcome"] == "success"
    assert summary["target_check"] == "not measurable on CPU"
    assert summary["best"]["speedup_vs_inductor"] is None  # CPU timings are not reported as speedups
    assert "Traceback" not in result.output


def test_text_mode_run_succeeds(server, problem, tmp_path):
    """Required 2 (CLI): code blocks only."""
    server.add(text(block(SYNTAX_ERROR)), text(block(WRONG)), text(block(GOOD)))
    out = tmp_path / "run"
    result = invoke(str(problem), *model_args(server), "--mode", "text", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert (out / "kernel.py").read_text() == GOOD
    assert all("tools" not in body for body in server.requests)


def test_max_turns_exhausted_without_a_correct_kernel(server, problem, tmp_path, monkeypatch):
    """Required 3: out of turns, nothing correct -> exit 1, trajectory saved (default --out)."""
    monkeypatch.chdir(tmp_path)
    server.add(text(block(WRONG)), tool("run_tests", {"code": WRONG}))
    result = invoke(str(problem), *model_args(server), "--max-turns", "2")
    assert result.exit_code == 1, result.output
    assert "no correct kernel found" in result.output.splitlines()[-1]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("-19_ReLU")
    traj = json.loads((run_dir / "trajectory.json").read_text())
    assert traj["status"] == "finished" and len(traj["steps"]) == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "no_correct_kernel" and summary["stop_reason"] == "limits"
    assert summary["best"] is None and not (run_dir / "kernel.py").exists()
    # The model was told before its last turn.
    assert "LAST turn" in server.requests[1]["messages"][-1]["content"]


def one_error_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    return lines[0]


def test_missing_model_is_one_line_exit_2(problem):
    """Required 5: no --model and no KERNELAGENT_MODEL."""
    result = invoke(str(problem))
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "--model" in line and "KERNELAGENT_MODEL" in line


def test_missing_key_is_one_line_exit_2(problem):
    """Required 5: a provider that needs a key, without one."""
    result = invoke(str(problem), "--model", "openai/gpt-4o", env={"OPENAI_API_KEY": None})
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in one_error_line(result)


def test_model_from_env(server, problem, tmp_path):
    server.add(tool("submit", {"code": GOOD}))
    result = invoke(str(problem), "--api-base", server.url, "--out", str(tmp_path / "r"),
                    "--quiet", env={"KERNELAGENT_MODEL": "openai/env-model"})
    assert result.exit_code == 0, result.output
    assert server.requests[0]["model"] == "env-model"
    assert len(result.output.strip().splitlines()) == 1  # --quiet: the result line only


@pytest.mark.parametrize("name,content,expected", [
    ("missing.py", None, "not found"),
    ("no_model.py", "def get_inputs():\n    return []\n", "missing Model"),
    ("broken.py", "class Model(:\n", "syntax error"),
])
def test_bad_problem_is_one_line_exit_2(tmp_path, name, content, expected):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    result = invoke(str(path), "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1")
    assert result.exit_code == 2
    assert expected in one_error_line(result)


@pytest.mark.parametrize("flag", [["--mode", "bogus"], ["--max-turns", "0"],
                                  ["--target-speedup", "fast"], ["--device", "tpu"]])
def test_bad_flag_exit_2_without_traceback(problem, flag):
    result = invoke(str(problem), "--model", "openai/x", *flag)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_live_panel_renders_on_a_terminal():
    import io

    from rich.console import Console

    from kernelagent.agent import Budget, Observation
    from kernelagent.agent.live import LiveView
    from kernelagent.models import tool_reply

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    budget = Budget(max_turns=5, max_cost=1.0)
    with LiveView(budget, console=console) as view:
        assert view.use_live
        view("start", problem="relu", model="m", mode="tools", device="NVIDIA H100", out="runs/x")
        budget.charge(100, 20, 0.01)
        view("model", turn=1, reply=tool_reply("profile"), budget=budget.snapshot())
        obs = Observation(text="", verdict="correct", passed=True, timed=True, measurable=True,
                          speedups={"compile": 1.37, "eager": 2.0}, seconds=1.5)
        view("tool", tool="profile", obs=obs, best=obs, turn=1)
    rendered = buffer.getvalue()
    for expected in ("profile -> correct, 1.37x vs inductor", "1 / 5", "$0.0100 / $1.0000", "120"):
        assert expected in rendered, expected


def test_live_panel_follows_a_whole_model_on_a_terminal():
    """optimize --whole-model on a terminal: the panel's region row follows the plan, each
    region, its turns and the end-to-end checks (orchestrate/whole_model.py's events, in its order)."""
    import io

    from rich.console import Console

    from kernelagent.agent import Budget, Observation
    from kernelagent.agent.live import LiveView
    from kernelagent.models import tool_reply

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=140)
    budget = Budget(max_turns=4, max_cost=1.0)
    with LiveView(budget, console=console) as view:
        assert view.use_live
        view("plan_start", problem="model.py", device="cpu")
        assert "region" in _panel(view) and "planning" in _panel(view)
        view("plan", regions=3, chosen=[("region_0", 0.61, "gemm"), ("region_1", 0.2, "elementwise")],
             totals={"warning": "the regions sum to 131.0% of the forward's time"})
        assert "0/2 regions" in _panel(view)
        view("region", region="region_0", index=1, count=2, share=0.61, kind="gemm", resumed=False)
        budget.charge(100, 20, 0.01)
        view("model", turn=1, reply=tool_reply("run_tests"), budget=budget.snapshot())
        obs = Observation(text="", verdict="correct", passed=True, timed=True, measurable=True,
                          speedups={"eager": 1.5}, seconds=1.0)
        view("tool", tool="run_tests", obs=obs, best=obs, turn=1)
        panel = _panel(view)
        assert "1/2: region_0 (gemm, 61.0% of the model's time)" in panel and "1 / 4" in panel
        view("region_done", region="region_0", status="kernel", why="", speedup=1.5)
        view("splice", region="region_0", status="correct", why="", speedup=1.2)
        assert "end-to-end checks: region_0" in _panel(view)
        view("e2e", verdict="correct", spliced=["region_0"], speedup=1.2, interval=(1.1, 1.3), baseline="eager")
        assert "done" in _panel(view)
    rendered = buffer.getvalue()
    for expected in ("plan: 3 regions; optimising 2: region_0 (gemm, 61.0%)", "warning: the regions sum to 131.0%",
                     "region 1/2: region_0 (gemm, 61.0%)", "turn 1/4: model -> run_tests", "region_0: kernel, 1.500x",
                     "end to end: correct, 1.200x [1.100, 1.300] vs eager; spliced: region_0"):
        assert expected in rendered, expected


def _panel(view) -> str:
    """The panel as a terminal shows it now."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=140, color_system=None).print(view.render())
    return out.getvalue()


def test_rejected_key_during_run_is_exit_2(server, problem, tmp_path):
    server.add(error(401, message="invalid api key"))
    out = tmp_path / "run"
    result = invoke(str(problem), *model_args(server), "--out", str(out))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("error: model 'openai/fake-coder' refused")
    assert json.loads((out / "trajectory.json").read_text())["status"] == "error"

"""Issue 56 item 7: a model server that accepts connections and never answers. The run ends within
the wall the user set (--model-timeout T, --max-retries R: R+1 attempts of T seconds and a bounded
backoff between them; litellm's import is not counted against a call) and gets its own outcome,
`model_unavailable` (exit 5), when no kernel the model wrote was judged: a verdict about the model
server, never 'the candidate failed'. A run where the model answered and a kernel of its was judged
keeps its normal verdict, and its last line says the model stopped answering.

Each test runs the real litellm client against tests/fake_openai_server.py (`hang()`: the request
is accepted and never answered) and the real harness on the CPU."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from kernelagent.errors import EXIT_FAILED, EXIT_MODEL_UNAVAILABLE
from tests.conftest import TESTS
from tests.fake_openai_server import FakeOpenAIServer, hang, text, tool
from tests.test_agent import RELU_PROBLEM, WRONG, block

ENV = {"COLUMNS": "120", "TERM": "dumb", "KERNELAGENT_MODEL": None, "KERNELAGENT_API_BASE": None,
       "KERNELAGENT_API_KEY": None}
TIMEOUT = 2.0


def bound(retries: int, turns: int = 1) -> float:
    """Generous for a loaded 2-core machine (harness start included), but below what the old
    behaviour took on the exit-code side as well: 3x the attempts' wall, plus 10 s."""
    return 3 * (retries + 1) * TIMEOUT * turns + 10


@pytest.fixture
def problem(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "19_ReLU.py"
    path.write_text(RELU_PROBLEM)
    return path


def optimize(server, problem, out, retries: int, *extra: str):
    args = ["optimize", str(problem), "--model", "openai/fake-coder", "--api-base", server.url,
            "--model-timeout", f"{TIMEOUT:g}", "--max-retries", str(retries), "--device", "cpu",
            "--out", str(out), "--no-live", *extra]
    started = time.monotonic()
    result = CliRunner().invoke(app, args, env=ENV, catch_exceptions=False)
    return result, time.monotonic() - started


# (name, script, --max-retries, extra flags, exit code, outcome, words of the last line)
ROWS = [
    ("never answers, one retry", [hang(), hang()], 1, ["--mode", "tools"], EXIT_MODEL_UNAVAILABLE,
     "model_unavailable", "the model did not answer, no kernel was judged (the model server did not answer "
                          "within --model-timeout 2 s after 2 attempts"),
    ("never answers, no retry", [hang()], 0, ["--mode", "tools"], EXIT_MODEL_UNAVAILABLE,
     "model_unavailable", "the model did not answer, no kernel was judged (the model server did not answer "
                          "within --model-timeout 2 s after 1 attempt ("),
    ("answers once without a kernel, then hangs", [text("Let me think."), hang()], 0, ["--mode", "text"],
     EXIT_MODEL_UNAVAILABLE, "model_unavailable", "the model did not answer, no kernel was judged"),
    ("answers once with a wrong kernel, then hangs", [tool("run_tests", {"code": WRONG}), hang()], 0,
     ["--mode", "tools"], EXIT_FAILED, "no_correct_kernel",
     "no correct kernel found (the model stopped answering: the model server did not answer within "
     "--model-timeout 2 s after 1 attempt ("),
    ("a search whose every call hangs", [hang(), hang()], 0, ["--strategy", "best-of-n", "--samples", "2"],
     EXIT_MODEL_UNAVAILABLE, "model_unavailable", "the model did not answer, no kernel was judged"),
]


@pytest.mark.parametrize("name, script, retries, extra, code, outcome, words", ROWS, ids=[r[0] for r in ROWS])
def test_a_model_that_never_answers_ends_within_the_wall_set_with_its_own_outcome(
        name, script, retries, extra, code, outcome, words, problem, tmp_path):
    out = tmp_path / "run"
    with FakeOpenAIServer(script) as server:
        result, wall = optimize(server, problem, out, retries, *extra)
        calls = len(server.requests)
    assert result.exit_code == code, result.output
    assert calls == len(script), (calls, result.output)  # R+1 attempts per call, no more
    assert wall < bound(retries, turns=2 if calls > retries + 1 and "--strategy" not in extra else 1), wall
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(words), last
    assert "Traceback" not in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == outcome and summary["exit_code"] == code
    assert summary["stop_reason"] == "model_error" and "--model-timeout 2 s" in summary["stop_detail"]
    trajectory = json.loads((out / "trajectory.json").read_text())
    assert trajectory["status"] == "finished" and trajectory["final"]["outcome"] == outcome


def test_the_call_bound_the_docs_quote():
    """LitellmModel.longest_call_s: R+1 attempts of T and each wait at most backoff_max."""
    from kernelagent.models.litellm_model import LitellmModel

    model = LitellmModel("openai/x", api_base="http://127.0.0.1:9/v1", timeout=5, max_retries=1, backoff_base=2)
    assert 12.0 < model.longest_call_s() <= 10 + 2.2
    many = LitellmModel("openai/x", api_base="http://127.0.0.1:9/v1", timeout=1, max_retries=20, backoff_base=2,
                        backoff_max=60)
    assert many.longest_call_s() <= 21 * 1 + 20 * 60


def test_bench_agent_mode_stops_on_a_model_that_never_answers(tmp_path):
    """`bench` in agent mode: the problem is recorded `model_unavailable` (asked again on resume), no
    other problem starts, one line on stderr, exit 5."""
    with FakeOpenAIServer([hang()]) as server:
        args = ["bench", str(TESTS / "bench_suite" / "agent"), "--model", "openai/fake-coder", "--api-base",
                server.url, "--model-timeout", f"{TIMEOUT:g}", "--max-retries", "0", "--mode", "tools",
                "--concurrency", "1", "--max-turns", "3", "--gpus", "cpu", "--store", str(tmp_path / "b.sqlite"),
                "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--no-live"]
        started = time.monotonic()
        result = CliRunner().invoke(app, args, env=ENV, catch_exceptions=False)
        wall = time.monotonic() - started
        calls = len(server.requests)
    assert result.exit_code == EXIT_MODEL_UNAVAILABLE, result.output
    assert calls == 1 and wall < bound(0) + 10, (calls, wall)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: the model did not answer, the batch stopped"), errors
    assert "--resume" in errors[0] and "Traceback" not in result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    statuses = [p.get("status") for p in summary["problems"]]
    assert statuses.count("model_unavailable") == 1, summary["problems"]


def test_whole_model_regions_after_a_model_that_never_answers_are_not_attempted(tmp_path, monkeypatch):
    """`optimize --whole-model`: the first region's calls are not answered; the second region gets no
    call (each would wait the same), no region has a kernel: exit 5, and the summary says why."""
    monkeypatch.setenv("KERNELAGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer([hang()]) as server:
        args = ["optimize", str(TESTS / "wholemodel" / "tiny.py"), "--whole-model", "--regions", "2",
                "--model", "openai/fake", "--api-base", server.url, "--model-timeout", f"{TIMEOUT:g}",
                "--max-retries", "0", "--max-turns", "4", "--device", "cpu", "--mode", "text", "--out", "run",
                "--no-live"]
        result = CliRunner().invoke(app, args, env={**ENV, "CUDA_VISIBLE_DEVICES": ""}, catch_exceptions=False)
        calls = len(server.requests)
    assert result.exit_code == EXIT_MODEL_UNAVAILABLE, result.output
    assert calls == 1, calls
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("whole model: the model did not answer, no kernel was judged"), last
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_MODEL_UNAVAILABLE and "--model-timeout 2 s" in summary["model_unavailable"]
    chosen = [r for r in summary["regions"] if r.get("chosen")]
    assert [r["status"] for r in chosen] == ["model unavailable", "not attempted"], chosen
    assert "did not answer in an earlier region" in chosen[1]["why"]

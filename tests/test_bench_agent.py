"""`kernelagent bench` in agent mode, end to end: the real litellm client against the fake
OpenAI server, the real harness on the CPU, two problems with model calls in flight at once;
then the same command again, which neither calls the model nor evaluates anything."""

from __future__ import annotations

import json
import sqlite3

from typer.testing import CliRunner

from kernelagent.cli import app
from tests.conftest import TESTS
from tests.fake_openai_server import FakeOpenAIServer, text, tool
from tests.test_agent import GOOD

AGENT_SUITE = TESTS / "bench_suite" / "agent"
ENV = {"COLUMNS": "120", "TERM": "dumb", "KERNELAGENT_MODEL": None, "KERNELAGENT_API_BASE": None,
       "KERNELAGENT_API_KEY": None}


def test_agent_mode_over_two_problems(tmp_path):
    with FakeOpenAIServer() as server:
        usage = {"prompt_tokens": 1000, "completion_tokens": 250}
        server.add(tool("submit", {"code": GOOD}, usage=usage), tool("submit", {"code": GOOD}, usage=usage))
        args = ["bench", str(AGENT_SUITE), "--model", "openai/fake-coder", "--api-base", server.url,
                "--retry-backoff", "0.01", "--model-timeout", "30", "--mode", "tools", "--concurrency", "2",
                "--max-turns", "3", "--trials", "2", "--quick-trials", "1", "--gpus", "cpu",
                "--store", str(tmp_path / "bench.sqlite"), "--out", str(tmp_path / "run"),
                "--cache-dir", str(tmp_path / "cache"), "--no-live", "--json"]
        result = CliRunner().invoke(app, args, env=ENV, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert len(server.requests) == 2
        data = json.loads(result.output.strip().splitlines()[-1])
        m = data["metrics"]
        assert data["run_id"].startswith("fake-coder-agent-")
        assert (m["problems"], m["compiled"], m["correct"]) == (2, 2, 2)
        assert m["tokens"] == {"prompt": 2000, "completion": 500, "total": 2500}
        assert data["evaluations"] == 2  # one submit per problem: full trials and timing, no re-verify

        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        problems = {p["key"]: p for p in summary["problems"]}
        assert set(problems) == {"level1/1_relu", "level1/2_relu_wide"}
        for key, p in problems.items():
            assert p["outcome"] == "success" and p["turns"] == 1 and p["tokens"]["total"] == 1250
            kernel = tmp_path / "run" / "problems" / key.replace("/", "__") / "kernel.py"
            assert kernel.read_text() == GOOD
            assert p["evaluations"] == 1 and p["wall_s"] > 0
        with sqlite3.connect(tmp_path / "bench.sqlite") as db:
            attempts = db.execute("SELECT problem_key, sample FROM attempts ORDER BY problem_key").fetchall()
        assert attempts == [("level1/1_relu", "eval-1"), ("level1/2_relu_wide", "eval-1")]
        html = (tmp_path / "run" / "report.html").read_text()
        assert "fake-coder" in html and "level1/2_relu_wide" in html

        # The same command again: both problems are finished, no model call, no evaluation.
        result = CliRunner().invoke(app, args, env=ENV, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        again = json.loads(result.output.strip().splitlines()[-1])
        assert again["evaluations"] == 0 and again["skipped"] == 2 and len(server.requests) == 2
        assert again["metrics"]["correct"] == 2 and again["metrics"]["tokens"]["total"] == 2500


def test_refused_key_stops_the_batch_with_exit_2(tmp_path):
    from tests.fake_openai_server import error

    with FakeOpenAIServer() as server:
        server.add(error(401, message="invalid api key"), error(401, message="invalid api key"))
        result = CliRunner().invoke(app, [
            "bench", str(AGENT_SUITE), "--model", "openai/fake-coder", "--api-base", server.url,
            "--retry-backoff", "0.01", "--concurrency", "1", "--gpus", "cpu", "--store", str(tmp_path / "s.sqlite"),
            "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--no-live"], env=ENV)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("error: model 'openai/fake-coder' refused")


def test_agent_mode_with_a_search_reports_the_tree_by_problem(tmp_path):
    """bench --strategy best-of-n --samples 2: each problem's search is in the record and the
    HTML report shows its tree size, the best by round and the spend (issue 26)."""
    from tests.test_agent import WRONG

    with FakeOpenAIServer() as server:
        usage = {"prompt_tokens": 100, "completion_tokens": 20}
        fence = "```python\n{}```"
        # Two problems, one at a time; each: a wrong and a right reply in round 0.
        server.add(*[text(fence.format(code), usage=usage) for code in (WRONG, GOOD, WRONG, GOOD)])
        args = ["bench", str(AGENT_SUITE), "--model", "openai/fake-coder", "--api-base", server.url,
                "--retry-backoff", "0.01", "--model-timeout", "30", "--concurrency", "1",
                "--strategy", "best-of-n", "--samples", "2", "--model-concurrency", "1",
                "--max-turns", "4", "--trials", "2", "--gpus", "cpu",
                "--store", str(tmp_path / "bench.sqlite"), "--out", str(tmp_path / "run"),
                "--cache-dir", str(tmp_path / "cache"), "--no-live", "--json"]
        result = CliRunner().invoke(app, args, env=ENV, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["metrics"]["correct"] == 2 and data["run_id"].startswith("fake-coder-agent-")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for p in summary["problems"]:
        search = p["search"]
        assert search["strategy"] == "best-of-n" and search["size"]["nodes"] == 2
        assert search["spend"]["model_calls"] == 2 and search["spend"]["tokens"] == 240
        assert [r["round"] for r in search["best_by_round"]] == [0]
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'id="search"' in html and "best-of-n ×2" in html and "r0:" in html

"""`kernelagent optimize --strategy beam --samples 4` end to end (issue 26): the real litellm
client against the fake OpenAI server on 127.0.0.1, the REAL harness (CPU, Triton's
interpreter: timings not meaningful), the tree trajectory, the summary's spend and best, an
SFT export that `datasets` loads, and a resume that buys nothing twice."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kernelagent.cli import app
from tests.conftest import CANDIDATES
from tests.fake_openai_server import FakeOpenAIServer, error, text

PROBLEM = CANDIDATES / "relu_problem.py"
GOOD = (CANDIDATES / "relu_good.py").read_text()
WRONG = (CANDIDATES / "relu_wrong.py").read_text()
ENV = {"CUDA_VISIBLE_DEVICES": "", "KERNELAGENT_MODEL": None, "KERNELAGENT_API_BASE": None,
       "KERNELAGENT_API_KEY": None, "COLUMNS": "120"}


def block(code: str, prose: str = "Here is my kernel.") -> str:
    return f"{prose}\n\n```python\n{code}```\n"


@pytest.fixture
def env(tmp_path):
    return {**ENV, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}


def run(args, env):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def test_beam_search_end_to_end_then_sft_export_loads_in_datasets(tmp_path, env):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "run"
    with FakeOpenAIServer() as server:
        # Round 0: four failures (wrong twice, the same module with a new comment, no code).
        # Round 1: the beam grows them; one child is right.
        server.add(text(block(WRONG)), text(block(WRONG.replace('"""Wrong', '"""Still wrong'))),
                   text(block("# a comment only\n" + WRONG)), text("I am thinking."),
                   text(block(GOOD)), text(block(WRONG)), text(block(WRONG)), text(block(WRONG)))
        result = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", server.url,
                      "--strategy", "beam", "--samples", "4", "--max-turns", "8", "--device", "cpu",
                      "--out", out, "--no-live"], env)
        requests = list(server.requests)
    assert result.exit_code == 0, result.output
    assert "correct kernel, meets the target" in result.output
    trajectory = json.loads((out / "trajectory.json").read_text())
    tree = trajectory["search"]
    assert tree["strategy"] == "beam" and tree["samples"] == 4
    nodes = tree["nodes"]
    assert [n["round"] for n in nodes[:4]] == [0, 0, 0, 0] and all(n["parent"] is None for n in nodes[:4])
    children = [n for n in nodes if n["round"] == 1]
    assert children and all(n["parent"] is not None for n in children)
    assert sum(n["duplicate_of"] is not None for n in nodes) >= 1  # the comment-only variant
    verdicts = [n["verdict"] for n in nodes]
    assert "no_action" in verdicts and "incorrect" in verdicts and "correct" in verdicts
    for n in nodes:
        assert set(n["times"]) >= {"model_start", "model_end"} and n["cost"]["prompt_tokens"] == 100
    # A child's request shows its parent's code and verdict to the model.
    child_request = next(r for r in requests if "Its verdict" in r["messages"][-1]["content"])
    assert "leaky_kernel" in child_request["messages"][-1]["content"]
    summary = json.loads((out / "summary.json").read_text())
    search = summary["search"]
    assert search["strategy"] == "beam" and search["spend"]["model_calls"] == summary["turns"] <= 8
    assert search["spend"]["tokens"] == 120 * summary["turns"]
    assert search["best"]["node"] is not None and "interval" in search["best"]
    assert [r["round"] for r in search["best_by_round"]] == [0, 1]
    assert summary["best"]["verdict"] == "correct" and (out / "kernel.py").read_text().strip() == GOOD.strip()
    assert trajectory["final_verification"][0]["passed"]
    # SFT: the winner's conversation, loadable by `datasets`.
    sft = tmp_path / "sft.jsonl"
    exported = run(["export", "sft", out, "--min-speedup", "0", "--include-test", "--out", sft], env)
    assert exported.exit_code == 0, exported.output
    rows = [json.loads(line) for line in sft.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["search_path"][-1] == rows[0]["search_node"]
    assert rows[0]["messages"][-2]["role"] == "assistant" and "triton" in rows[0]["messages"][-2]["content"]
    loaded = datasets.load_dataset("json", data_files=str(sft), split="train")
    assert loaded.num_rows == 1 and loaded[0]["messages"][0]["role"] == "system"
    # --all-winners: every correct node (here the one winner: CPU speeds are unmeasured).
    winners = tmp_path / "winners.jsonl"
    exported = run(["export", "sft", out, "--min-speedup", "0", "--include-test", "--all-winners",
                    "--out", winners], env)
    assert exported.exit_code == 0 and len(winners.read_text().splitlines()) == 1, exported.output
    # The per-node records: one row per node with a reply, the reward the RL reward gives it.
    nodes_file = tmp_path / "nodes.jsonl"
    listed = run(["dataset", "nodes", out, "--out", nodes_file], env)
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in nodes_file.read_text().splitlines()]
    assert len(rows) == len(nodes) and {r["node"] for r in rows} == {n["id"] for n in nodes}
    by_verdict = {r["verdict"]: r for r in rows}
    assert by_verdict["no_action"]["reward"] == 0.0
    assert by_verdict["correct"]["reward"] > by_verdict["incorrect"]["reward"] >= 0
    assert all(r["prompt"][0]["role"] == "system" and r["completion"][0]["role"] == "assistant" for r in rows)
    assert datasets.load_dataset("json", data_files=str(nodes_file), split="train").num_rows == len(rows)


def test_a_search_resumes_from_its_folder_and_refuses_what_is_not_one(tmp_path, env):
    out = tmp_path / "run"
    with FakeOpenAIServer() as server:
        server.add(text(block(WRONG)), text(block(WRONG.replace("0.01", "0.02"))))
        first = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", server.url,
                     "--strategy", "best-of-n", "--samples", "2", "--max-turns", "2", "--device", "cpu",
                     "--out", out, "--no-live"], env)
        assert first.exit_code == 1, first.output  # no correct kernel within 2 calls
        server.add(text(block(GOOD)), text(block(WRONG)))
        again = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", server.url,
                     "--resume", out, "--max-turns", "4", "--device", "cpu", "--no-live"], env)
        calls = len(server.requests)
    assert again.exit_code == 0, again.output
    assert calls == 4  # two before, two after: nothing bought twice
    trajectory = json.loads((out / "trajectory.json").read_text())
    assert len(trajectory["search"]["nodes"]) == 4 and len(trajectory["resumed"]) == 1
    assert [n["action"] for n in trajectory["search"]["nodes"][2:]] == ["continue", "continue"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["turns"] == 4 and summary["search"]["spend"]["model_calls"] == 4
    # A folder that holds no search is refused in one line.
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "trajectory.json").write_text("{}")
    refused = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", "http://127.0.0.1:9/v1",
                   "--resume", tmp_path / "plain", "--device", "cpu"], env)
    assert refused.exit_code == 2 and "not a search run" in refused.stderr
    # Other settings than the run's are refused, not silently replaced by the run's (issue 43).
    other = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", "http://127.0.0.1:9/v1",
                 "--resume", out, "--strategy", "beam", "--device", "cpu"], env)
    assert other.exit_code == 2, other.output
    assert other.stderr.strip() == (f"error: --resume {out} continues a best-of-n search with --samples 2: "
                                    "--strategy beam differs; leave it out, or start a new run with --out")
    same = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", "http://127.0.0.1:9/v1",
                "--resume", out, "--samples", "3", "--device", "cpu"], env)
    assert same.exit_code == 2 and "--samples 3 differs" in same.stderr, same.output


def test_turn_lines_and_the_stop_line_agree_after_a_failed_model_call(tmp_path, env):
    """A failed model call takes its turn: the turn lines and the stop line count the same calls
    (the issue saw `turn 14/14`, then `13/14 turns`), and every line numbers nodes from 0, as
    trajectory.json and summary.json do."""
    out = tmp_path / "run"
    with FakeOpenAIServer() as server:
        # One candidate, evaluated once (the others are duplicates of it), and one failed call.
        server.add(text(block(WRONG)), text(block(WRONG)), text(block(WRONG)), error(400, message="bad request"))
        result = run(["optimize", PROBLEM, "--model", "openai/fake-coder", "--api-base", server.url,
                      "--strategy", "best-of-n", "--samples", "2", "--max-turns", "4", "--max-retries", "0",
                      "--device", "cpu", "--out", out, "--no-live"], env)
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    turns = [line for line in lines if line.startswith("turn ")]
    assert sorted(int(line.split()[1].split("/")[0]) for line in turns) == [1, 2, 3, 4], turns
    assert all(line.split()[1].endswith("/4") and "(node " in line for line in turns), turns
    assert sum(": model error: " in line for line in turns) == 1, turns
    stop = next(line for line in lines if line.startswith("stopped: "))
    assert stop == "stopped: limits: turns budget spent (4/4 turns)", stop
    nodes = {int(n) for line in turns for n in __import__("re").findall(r"\(node (\d+)\)", line)}
    assert nodes == {0, 1, 2, 3}, turns
    judged = [line for line in lines
              if line.startswith("node ") and (": evaluate -> " in line or ": duplicate -> " in line)]
    assert len(judged) == 3 and all(int(line.split()[1].rstrip(":")) in nodes for line in judged), judged
    summary = json.loads((out / "summary.json").read_text())
    assert summary["turns"] == 4 and summary["search"]["spend"]["model_calls"] == 4

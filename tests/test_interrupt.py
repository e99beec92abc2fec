"""Ctrl-C, as a terminal sends it: SIGINT to the whole process group of a real `kernelagent`
process. `optimize` (against the fake model server) keeps the best kernel so far, writes
summary.json with outcome "interrupted", says so in one line and exits 130 within 2 s;
`eval` says it was interrupted and exits 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CANDIDATES, REPO
from tests.fake_openai_server import FakeOpenAIServer, tool
from tests.test_agent import GOOD, RELU_PROBLEM

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT")


def start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache"),
           "COLUMNS": "120"}
    for name in ("KERNELAGENT_MODEL", "KERNELAGENT_API_BASE", "KERNELAGENT_API_KEY"):
        env.pop(name, None)
    return subprocess.Popen([sys.executable, "-m", "kernelagent", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)  # its own group, so that killpg is Ctrl-C


def interrupt(proc: subprocess.Popen) -> tuple[int, str, str, float]:
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err, time.monotonic() - sent


def wait_for(predicate, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"exited early ({proc.returncode}): {proc.communicate()}")
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("timed out waiting for the run to get there")


def test_optimize_ctrl_c_keeps_the_best_kernel(tmp_path):
    problem = tmp_path / "19_ReLU.py"
    problem.write_text(RELU_PROBLEM)
    out = tmp_path / "run"
    # Turn 1 finds a correct kernel (run_tests: not a submit, so the run goes on); turn 2's
    # model reply never comes in time: Ctrl-C lands while the run waits for it.
    with FakeOpenAIServer([tool("run_tests", {"code": GOOD}), {"delay": 60, "content": "late"}]) as server:
        proc = start(["optimize", str(problem), "--model", "openai/fake", "--api-base", server.url,
                      "--out", str(out), "--no-live", "--mode", "tools", "--model-timeout", "120"], tmp_path)
        wait_for(lambda: len(server.requests) >= 2, 180, proc)
        code, stdout, stderr, seconds = interrupt(proc)
    assert code == 130, (stdout, stderr)
    assert seconds < 2.0, f"took {seconds:.2f} s to exit"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "interrupted" and summary["exit_code"] == 130
    assert summary["best"] is not None and summary["best_verified"] is False
    assert (out / "kernel.py").read_text() == GOOD
    assert json.loads((out / "trajectory.json").read_text())["status"] == "interrupted"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: best kernel so far") and str(out / "summary.json") in last
    assert last.endswith("a single conversation cannot be resumed (a --strategy search can, with --resume)")
    assert "Traceback" not in stderr + stdout


def test_a_search_ctrl_c_says_how_to_go_on(tmp_path):
    problem = tmp_path / "19_ReLU.py"
    problem.write_text(RELU_PROBLEM)
    out = tmp_path / "run"
    with FakeOpenAIServer([{"delay": 60, "content": "late"}]) as server:
        proc = start(["optimize", str(problem), "--model", "openai/fake", "--api-base", server.url,
                      "--out", str(out), "--no-live", "--strategy", "best-of-n", "--samples", "1",
                      "--model-timeout", "120"], tmp_path)
        wait_for(lambda: len(server.requests) >= 1, 180, proc)
        code, stdout, stderr, _seconds = interrupt(proc)
    assert code == 130, (stdout, stderr)
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: no correct kernel yet; summary: ")
    assert last.endswith(f"; to go on: kernelagent optimize {problem} --resume {out}"), last


def test_eval_ctrl_c_says_so(tmp_path):
    proc = start(["eval", str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "hangs.py"), "--no-baselines"],
                 tmp_path)
    time.sleep(8)  # the harness is up and the candidate hangs in its stage
    code, stdout, stderr, seconds = interrupt(proc)
    assert code == 130, (stdout, stderr)
    assert seconds < 2.0, f"took {seconds:.2f} s to exit"
    assert stderr.strip().splitlines()[-1] == "interrupted: the evaluation was stopped before a verdict"
    assert "Traceback" not in stderr + stdout


def test_serve_exits_130_on_sigint(tmp_path):
    proc = start(["serve", "--gpus", "cpu", "--port", "0"], tmp_path)
    line = proc.stdout.readline()  # printed once it listens
    assert "listening on http://127.0.0.1:" in line, (line, proc.poll())
    code, stdout, stderr, seconds = interrupt(proc)
    assert code == 130, (stdout, stderr)
    assert stderr.strip().splitlines()[-1] == "kernelagent serve: interrupted, stopped"
    assert "Traceback" not in stderr + stdout

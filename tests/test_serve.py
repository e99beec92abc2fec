"""`kernelagent serve`: a real subprocess on 127.0.0.1 (a free port it picks), real HTTP,
the real harness (two CPU evaluators). Every request is bounded; the server is stopped at
the end with SIGTERM (killed if it does not stop)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from kernelagent.rl.service import RemoteReward
from tests.conftest import REPO, read
from tests.rl_fixtures.common import GOOD, RELU_PROBLEM, SYNTAX, WRONG

EVAL = json.dumps({"target_ms": 10, "warmup_ms": 2, "max_reps": 10})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cmd = [sys.executable, "-c", "from kernelagent.cli import main; main()", "serve", "--gpus", "cpu",
           "--cpu-workers", "2", "--port", "0", "--trials", "2", "--eval-config", EVAL,
           "--max-pending", "6", "--request-timeout", "120",
           "--cache-dir", str(tmp_path_factory.mktemp("serve-cache"))]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    url, deadline = None, time.monotonic() + 60
    while url is None and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if "listening on " in line:
            url = line.split("listening on ")[1].split()[0]
    if url is None:
        proc.kill()
        pytest.fail("kernelagent serve did not start")
    yield {"url": url, "proc": proc, "lines": lines}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        pytest.fail("kernelagent serve did not stop on SIGTERM")
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert proc.returncode == 0, "".join(rest)
    assert any("stopped" in line for line in rest)


def post(url: str, body, timeout: float = 120) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/reward", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def get(url: str, path: str = "/health") -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def fenced(code: str) -> str:
    return f"My kernel:\n```python\n{code}```"


def test_health_and_a_batch(server):
    url = server["url"]
    assert url.startswith("http://127.0.0.1:")
    status, health = get(url)
    assert status == 200 and health["status"] == "ok" and health["capacity"] == 6
    assert health["reward_config"]["r_max"] == 3.0
    source = read(RELU_PROBLEM)
    completions = [[{"role": "assistant", "content": fenced(GOOD)}], fenced(WRONG), fenced(SYNTAX), "no code"]
    status, reply = post(url, {"completions": completions, "problem_source": [source] * 4,
                               "problem_id": ["relu_problem"] * 4})
    assert status == 200, reply
    assert reply["rewards"] == [1.5, 0.5, 0.0, 0.0]
    assert [d["status"] for d in reply["details"]] == ["correct", "incorrect", "compile_error", "no_code"]
    # the items form, and the trainer-side client with TRL's kwargs
    status, reply = post(url, {"items": [{"completion": fenced(WRONG), "problem_source": source}]})
    assert status == 200 and reply["rewards"] == [0.5]
    remote = RemoteReward(url, timeout=120)
    values = remote(prompts=["p", "p"], completions=[fenced(GOOD), "nothing"], completion_ids=[[1], [2]],
                    trainer_state=object(), problem_source=[source] * 2)
    assert values == [1.5, 0.0] and remote.health()["served"] >= 7


def test_bad_requests(server):
    url = server["url"]
    assert post(url, b"not json")[0] == 400
    assert post(url, {"completions": ["x"]})[0] == 400  # no problem column
    assert post(url, {"completions": ["x"] * 7, "problem_source": ["y"] * 7})[0] == 413  # over capacity
    assert get(url, "/nope")[0] == 404


def test_backpressure_and_timeout(server):
    url = server["url"]
    source = read(RELU_PROBLEM)
    # six distinct candidates fill the capacity (two evaluators: this takes seconds)
    batch = [fenced(GOOD.replace("return relu(x)", f"return relu(x)  # {i}")) for i in range(6)]
    first: dict = {}
    worker = threading.Thread(target=lambda: first.update(
        zip(("status", "reply"), post(url, {"completions": batch, "problem_source": [source] * 6}))))
    worker.start()
    deadline = time.monotonic() + 30
    while get(url)[1]["pending"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    status, reply = post(url, {"completions": [fenced(WRONG)], "problem_source": [source]})
    assert status == 429 and "busy" in reply["error"]
    worker.join(timeout=120)
    assert first["status"] == 200 and first["reply"]["rewards"] == [1.5] * 6
    # a deadline shorter than any evaluation: 504, and the slots come back afterwards
    status, reply = post(url, {"completions": [fenced(WRONG + "\n# t")], "problem_source": [source],
                               "timeout": 0.01})
    assert status == 504 and "timed out" in reply["error"]
    deadline = time.monotonic() + 60
    while get(url)[1]["pending"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert get(url)[1]["pending"] == 0 and get(url)[1]["timeouts"] == 1

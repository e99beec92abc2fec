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


# One worker under pytest-xdist: one reward server (its harness servers started) for the file.
pytestmark = pytest.mark.xdist_group("serve")


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


# -- the client survives restarts and errors; the service never strands a client ----------

import http.server
import socket

from kernelagent.rl.service import RewardService, ServiceError
from kernelagent.rl.trl import KernelReward


class Scripted:
    """An HTTP server on 127.0.0.1 answering POSTs from a script of (status, headers, body)."""

    def __init__(self, script):
        self.script, self.seen = list(script), 0
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                status, headers, body = outer.script.pop(0)
                outer.seen += 1
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.H = H

    def start(self, port=0):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), self.H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self.httpd.server_address[1]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


OK = {"rewards": [1.5, None], "details": [{"compiled": True, "correct": True, "status": "correct"},
                                          {"infra_error": True, "status": "harness_error"}]}


def test_remote_reward_retries_restarts_and_5xx_then_logs_metrics():
    port = free_port()  # nothing listens yet: the service is "restarting"
    fake = Scripted([(503, {"Retry-After": "0"}, {"error": "closing"}), (502, {}, {"error": "proxy"}),
                     (200, {}, OK)])
    threading.Timer(0.4, fake.start, args=(port,)).start()
    metrics, extra = {}, {}
    remote = RemoteReward(f"http://127.0.0.1:{port}", timeout=10, backoff=0.1, max_backoff=0.3)
    try:
        rewards = remote(completions=["a", "b"], problem_source=["p", "p"],
                         log_metric=lambda k, v: metrics.__setitem__(k, v),
                         log_extra=lambda k, v: extra.__setitem__(k, v))
    finally:
        time.sleep(0.5)
        fake.stop()
    assert rewards == [1.5, None]
    assert remote.attempts >= 4 and fake.seen == 3  # refused at least once, then 503, 502, 200
    assert metrics == {"kernel/compiled": 0.5, "kernel/correct": 0.5, "kernel/infra_error": 0.5}
    assert extra == {"kernel_status": ["correct", "harness_error"]}


def test_remote_reward_async_and_giving_up():
    import asyncio

    fake = Scripted([(200, {}, OK), (400, {}, {"error": "bad"})])
    port = fake.start()
    try:
        fn = RemoteReward(f"http://127.0.0.1:{port}", timeout=10).as_async()
        assert asyncio.run(fn(completions=["a", "b"], problem_source="p")) == [1.5, None]
        with pytest.raises(ServiceError, match="400"):  # a client error is not retried
            RemoteReward(f"http://127.0.0.1:{port}", timeout=10)(completions=["a"], problem_source="p")
        assert fake.seen == 2
    finally:
        fake.stop()
    dead = RemoteReward(f"http://127.0.0.1:{free_port()}", timeout=2, retries=2, backoff=0.05)
    with pytest.raises(ServiceError, match="unavailable after 3 attempts"):
        dead(completions=["a"], problem_source="p")


class NoEval:
    def submit(self, *job):
        raise AssertionError("not reached")


@pytest.fixture
def small_service():
    service = RewardService(KernelReward(NoEval()), max_body=1000, read_timeout=0.5)
    httpd = service.make_server("127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield service, httpd.server_address[1]
    service.close()


def raw(port: int, data: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
        return out


def test_service_bodies_413_408_and_503(small_service):
    service, port = small_service
    url = f"http://127.0.0.1:{port}"
    # too large: the client's whole write goes through and it reads the 413
    status, body = post(url, b"x" * 200_000)
    assert status == 413 and "over 1000 bytes" in body["error"]
    # a client that asks first gets the 413 before sending anything
    head = (b"POST /reward HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n"
            b"Expect: 100-continue\r\n\r\n")
    assert raw(port, head).startswith(b"HTTP/1.1 413")
    # a body shorter than its Content-Length: 408 after the read timeout, thread freed
    start = time.monotonic()
    answer = raw(port, b"POST /reward HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"comp")
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 5
    # shutting down: 503 with Retry-After, like 429
    service.closing = True
    request = urllib.request.Request(f"{url}/reward", data=b'{"completions": []}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 503 and err.value.headers["Retry-After"] == "5"


def test_token_is_required_when_set_and_client_sends_it(tmp_path):
    """--token: a request without the bearer token gets 401; RemoteReward with it is served."""
    import urllib.error
    import urllib.request

    from kernelagent.rl.service import RemoteReward, RewardService

    class NoReward:
        config = type("C", (), {"to_dict": staticmethod(lambda: {})})()
        started_backend = None  # KernelReward.started_backend: none started

        def close(self) -> None:
            pass

    service = RewardService(NoReward(), token="s3cret")  # type: ignore[arg-type]
    httpd = service.make_server("127.0.0.1", 0)
    import threading

    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{url}/health", timeout=10)
        assert denied.value.code == 401
        wrong = urllib.request.Request(f"{url}/health", headers={"Authorization": "Bearer nope"})
        with pytest.raises(urllib.error.HTTPError) as denied2:
            urllib.request.urlopen(wrong, timeout=10)
        assert denied2.value.code == 401
        assert RemoteReward(url, token="s3cret").health()["status"] == "ok"
    finally:
        service.close()


def test_a_problem_path_never_echoes_file_content(tmp_path):
    from kernelagent.rl.trl import problems_from_columns

    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:TOP-SECRET-LINE\n")
    [problem] = problems_from_columns({"problem_path": [str(secret)]}, 1)
    assert isinstance(problem, Exception)
    assert "TOP-SECRET" not in str(problem) and "not a readable KernelBench problem" in str(problem)

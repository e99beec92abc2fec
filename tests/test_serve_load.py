"""Both HTTP servers under load, on 127.0.0.1, in bounded loops (benchmarks/serve_load.py, run
small): many trainers or MCP sessions at once, and beside them heads and bodies that stall or
trickle, oversized bodies, malformed heads, bad tokens, idle connections and clients that hang
up mid-batch. Nothing is lost (every trainer's every batch is scored, each answer its own),
nothing hangs (every request is answered within the read timeout and a margin), every answer is
a documented status, and nothing stays pending or open afterwards. The harness is a stand-in, so
these are the HTTP layer's seconds."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import serve_load  # noqa: E402

READ_TIMEOUT = 0.5
BOUND = 20.0  # a client's socket timeout: a request not answered by then has hung


def held(result: dict) -> None:
    """What both servers must show after a run."""
    assert result["wrong_answers"] == 0, result
    assert result["undocumented"] == {}, result["undocumented"]
    assert result["unexpected"] == {}, result["unexpected"]  # each abusive client got its own status
    assert result["over_bound"] == 0 and result["settled"], result
    kinds = result["kinds"]
    assert set(serve_load.EXPECTED) <= set(kinds), set(serve_load.EXPECTED) - set(kinds)
    for kind in ("slow head", "body stops short", "body trickles", "idle connection"):
        # answered at the read timeout (plus what a busy machine adds), long before the client gives up
        assert kinds[kind]["max_ms"] < BOUND / 2 * 1000, (kind, kinds[kind])


def test_the_reward_service_under_load():
    result = serve_load.run_serve(trainers=12, batches=3, batch=4, eval_ms=5, workers=4, abuse_rounds=1,
                                  leavers=2, read_timeout=READ_TIMEOUT, max_body=16 * 1024, bound=BOUND)
    held(result)
    trainer = result["kinds"]["trainer"]["statuses"]
    assert trainer.get("200") == 12 * 3 and set(trainer) <= {"200", "429"}, trainer
    assert result["pending_after"] == 0


def test_the_mcp_server_under_load():
    result = serve_load.run_mcp(sessions=8, calls=3, work_ms=5, abuse_rounds=1, leavers=2,
                                read_timeout=READ_TIMEOUT, bound=BOUND, max_body=16 * 1024)
    held(result)
    kinds = result["kinds"]
    assert kinds["mcp initialize"]["statuses"] == {"200": 10}
    assert kinds["mcp tool call"]["statuses"] == {"200": 8 * 3}


def test_connections_over_the_limit_get_503_and_are_served_when_they_retry():
    """Sixteen trainers against four connections: uvicorn's limit answers the rest 503 (plain
    text, as documented), they retry, and every batch is scored."""
    result = serve_load.run_serve(trainers=16, batches=2, batch=1, eval_ms=40, workers=2, abuse_rounds=0,
                                  leavers=0, read_timeout=READ_TIMEOUT, max_connections=4, bound=BOUND)
    trainer = result["kinds"]["trainer"]["statuses"]
    assert trainer.get("200") == 16 * 2 and trainer.get("503", 0) > 0 and set(trainer) <= {"200", "503"}, trainer
    assert result["wrong_answers"] == 0 and result["settled"] and result["pending_after"] == 0, result


def test_a_client_that_asks_first_gets_413_before_it_sends_the_body():
    """`Expect: 100-continue` with a Content-Length over the limit: 413 at once, where the body's
    read timeout (10 s here) would have been spent waiting for a body that never comes."""
    service, _ = serve_load.standin_service(1, 1, max_body=1000, read_timeout=10.0)
    server = service.make_server("127.0.0.1", 0)
    server.start()
    try:
        started = time.monotonic()
        answer = serve_load.raw(server.server_address[1], serve_load.head(
            "POST", "/reward", "Expect: 100-continue", length=5000), timeout=BOUND)
        assert answer == 413 and time.monotonic() - started < 5.0
    finally:
        service.close()


@pytest.fixture
def slow_service():
    """A reward service whose stand-in harness takes 1 s per completion on two workers."""
    service, backend = serve_load.standin_service(1000, 2, max_pending=64, read_timeout=READ_TIMEOUT)
    server = service.make_server("127.0.0.1", 0)
    server.start()
    yield service, backend, server.server_address[1]
    service.close()


def test_clients_that_hang_up_mid_batch_leave_nothing_pending(slow_service):
    """Three trainers send six completions each and hang up: their evaluations not yet started are
    cancelled at once (18 queued on two workers would take 9 s), the two running finish."""
    service, backend, port = slow_service
    tally = serve_load.Tally()
    leavers = [threading.Thread(target=serve_load.leaver, args=(port, t, tally),
                                kwargs=dict(batch=6, token=None, after=0.15, timeout=BOUND)) for t in range(3)]
    for thread in leavers:
        thread.start()
    for thread in leavers:
        thread.join(BOUND)
    assert serve_load.wait_until(lambda: service.pending == 0, BOUND), service.health()
    # the two that were running, not the whole queue
    assert service.health()["disconnects"] == 3 and backend.started <= 4, (service.health(), backend.started)
    # and the service goes on: the next batch is scored
    status, _, data = serve_load.post_json(port, "/reward", {"completions": ["after"], "problem_source": ["p"]},
                                           {}, BOUND)
    assert status == 200 and json.loads(data)["rewards"] == [serve_load.standin_value("after")]
    assert serve_load.wait_until(lambda: service.server.connections == 0, 2.0)


def test_a_service_that_stops_answers_its_requests_in_flight_503(slow_service):
    """A stop (SIGTERM) answers the batches in flight at once, 503 with Retry-After, so that the
    trainers send them again; their evaluations not yet started are cancelled."""
    service, backend, port = slow_service
    answer: dict = {}

    def post() -> None:
        status, response, data = serve_load.post_json(
            port, "/reward", {"completions": [f"c{i}" for i in range(8)], "problem_source": ["p"] * 8}, {}, BOUND)
        answer.update(status=status, retry=response.getheader("Retry-After"))

    thread = threading.Thread(target=post)
    thread.start()
    assert serve_load.wait_until(lambda: service.pending == 8, BOUND)
    service.stop_accepting()
    thread.join(BOUND)
    assert answer["status"] == 503 and answer["retry"] == "5", answer  # not the 200 four seconds later
    assert serve_load.wait_until(lambda: service.pending == 0, BOUND) and backend.started <= 4


CHILD = """
import sys
sys.path.insert(0, {benchmarks!r})
import serve_load
service, _ = serve_load.standin_service(1000, 2, max_pending=64)
server = service.make_server("127.0.0.1", 0)
try:
    server.serve_until_signal(on_stop=service.stop_accepting, ready=lambda: print(server.server_address[1], flush=True))
finally:
    service.close()
print("stopped", flush=True)
"""


def test_sigterm_answers_the_batches_in_flight_and_exits_0():
    """The signal path `kernelagent serve` takes (serve_until_signal): SIGTERM answers a batch in
    flight 503 at once (uvicorn's own handling would wait its grace, then cancel it: a 500) and
    the process ends normally, its cleanup done."""
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(benchmarks=str(REPO / "benchmarks"))], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = int(proc.stdout.readline())
        answer: dict = {}
        body = {"completions": [f"c{i}" for i in range(8)], "problem_source": ["p"] * 8}
        thread = threading.Thread(target=lambda: answer.update(
            status=serve_load.post_json(port, "/reward", body, {}, BOUND)[0]))
        thread.start()
        assert serve_load.wait_until(lambda: _health(port)["pending"] == 8, BOUND)
        proc.send_signal(signal.SIGTERM)
        thread.join(BOUND)
        assert answer.get("status") == 503, answer
        assert proc.wait(BOUND) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _health(port: int) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=BOUND) as response:
        return json.loads(response.read())


def test_serve_without_starlette_or_uvicorn_says_so_in_one_line(monkeypatch):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    monkeypatch.setitem(sys.modules, "starlette", None)  # `import starlette` raises ImportError
    result = CliRunner().invoke(app, ["serve", "--gpus", "cpu", "--port", "0"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs starlette" in lines[0] and "kernelagent[rl]" in lines[0], result.output
    assert "Traceback" not in result.output


def test_a_port_that_cannot_be_bound_is_one_line_and_exit_2():
    """Both servers bind before they start: a port in use is a UserError (one line, exit 2)."""
    import socket

    from kernelagent.cli.mcp_cmd import _serve_http
    from kernelagent.errors import UserError

    class SDKServer:
        def streamable_http_app(self, **_kwargs):
            return None

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):
            _serve_http(SDKServer(), "127.0.0.1", port, None)
        service, _ = serve_load.standin_service(1, 1)
        with pytest.raises(OSError):
            service.make_server("127.0.0.1", port)
        service.close()

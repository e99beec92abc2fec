"""`kernelagent mcp` (issue 28) through the official SDK's own client, against a real server
subprocess: over stdio (what desktop agents launch) and over streamable HTTP with a bearer token.
CPU only: the harness runs under Triton's interpreter, timings are not meaningful."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

mcp = pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402

from tests.conftest import CANDIDATES, REPO  # noqa: E402

ADVERSARIAL = REPO / "tests" / "adversarial"
GOOD = (CANDIDATES / "relu_good.py").read_text()
# The SDK's stdio client hands the server a small environment of its own: no warm harness (conftest).
ENV = {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "KERNELAGENT_DAEMON": "0"}


def server_args(*extra: str) -> list[str]:
    return ["-m", "kernelagent", "mcp", "--problems", str(CANDIDATES), "--root", str(ADVERSARIAL), "--device", "cpu",
            *extra]


async def with_stdio(body, *extra: str, cache: str):
    params = StdioServerParameters(command=sys.executable, args=server_args(*extra),
                                   env={**ENV, "KERNELAGENT_CACHE_DIR": cache})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)


def run(coro):
    return asyncio.run(coro)


def text(result) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def test_tools_their_schemas_and_verdicts_over_stdio(tmp_path):
    async def body(s):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == {"list_problems", "read_reference", "evaluate", "profile", "plan", "verify"}
        schema = tools["evaluate"].input_schema
        assert schema["required"] == ["problem"] and {"code", "candidate", "trials", "timing"} <= set(schema["properties"])
        assert {"status", "passed", "speedups", "flags", "text"} <= set(tools["evaluate"].output_schema["properties"])
        good = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 2})
        wrong = await s.call_tool("evaluate", {"problem": "relu_problem.py", "candidate": "relu_wrong.py",
                                               "trials": 2})
        profiled = await s.call_tool("profile", {"problem": "relu_problem.py", "candidate": "relu_good.py"})
        reference = await s.call_tool("read_reference", {"problem": "relu_problem.py"})
        listed = await s.call_tool("list_problems", {"directory": "."})
        prompts = {p.name for p in (await s.list_prompts()).prompts}
        task = await s.get_prompt("task_prompt", {"problem": "relu_problem.py"})
        resources = {str(r.uri) for r in (await s.list_resources()).resources}
        return good, wrong, profiled, reference, listed, prompts, task, resources

    good, wrong, profiled, reference, listed, prompts, task, resources = run(
        with_stdio(body, cache=str(tmp_path / "cache")))
    assert not good.is_error and good.structured_content["status"] == "correct" and good.structured_content["passed"]
    assert "correctness:" in text(good)  # the same rendering our loop shows a model
    assert wrong.structured_content["status"] == "incorrect" and not wrong.structured_content["passed"]
    assert profiled.structured_content["status"] == "correct" and "analysis" in text(profiled) + "analysis"
    assert "class Model" in reference.structured_content["source"]
    assert any(p.endswith("relu_problem.py") for p in listed.structured_content["problems"])
    assert {"system_prompt", "task_prompt"} <= prompts
    assert "class Model" in task.messages[0].content.text
    assert "kernelagent://problems" in resources


def test_initialize_reports_the_version_and_plan_writes_in_the_servers_own_folder(tmp_path):
    """The server said version '' at `initialize`; `plan` without `out` wrote <problem>_plan/ into the
    --problems folder, beside the user's problems. Now: the package's version, and a plan in the
    server's own output folder whose regions are still problems this server evaluates."""
    import kernelagent

    before = sorted(p.name for p in CANDIDATES.iterdir())
    params = StdioServerParameters(command=sys.executable, args=server_args(),
                                   env={**ENV, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")})

    async def body():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                plan = await s.call_tool("plan", {"problem": "relu_problem.py"})
                regions = [r["problem"] for r in plan.structured_content["regions"] if r.get("problem")]
                judged = await s.call_tool("evaluate", {"problem": regions[0], "code": GOOD, "trials": 1,
                                                        "timing": False}) if regions else None
                there = Path(plan.structured_content.get("plan", "")).is_file()  # while the server runs
                return init, plan, regions, judged, there

    init, plan, regions, judged, there = run(body())
    assert init.server_info.name == "kernelagent" and init.server_info.version == kernelagent.__version__
    assert not plan.is_error, text(plan)
    written = Path(plan.structured_content["plan"])
    assert there and written.parent.name == "relu_problem_plan"
    assert written.parent.parent.name == "outputs" and written.parent.parent.parent.name.startswith("kernelagent-mcp-")
    assert not written.is_relative_to(CANDIDATES) and not written.is_relative_to(ADVERSARIAL)
    assert sorted(p.name for p in CANDIDATES.iterdir()) == before  # nothing new beside the problems
    assert "removed when the server stops" in text(plan) and str(written) in text(plan)
    assert regions and all(Path(r).is_relative_to(written.parent) for r in regions)
    # issue 56: the plan's own doubts (a forward that moved between its rounds) are fields and lines
    said, unsteady = plan.structured_content["warnings"], plan.structured_content["unsteady"]
    assert isinstance(said, list) and isinstance(unsteady, bool) and (not unsteady or said)
    assert all(f"warning: {w}" in text(plan) for w in said)
    assert "noise" in plan.structured_content["regions"][0] and "interleaved rounds" in text(plan)
    assert judged is not None and judged.structured_content["status"] == "correct", text(judged)
    assert not written.exists()  # the server's folder goes with it


def test_paths_outside_the_roots_and_bad_arguments_are_tool_errors(tmp_path):
    secret = tmp_path / "secret.py"
    secret.write_text("TOKEN = 'ka-canary-mcp'\nclass ModelNew: pass\n")

    async def body(s):
        outside = await s.call_tool("evaluate", {"problem": "relu_problem.py", "candidate": str(secret)})
        escape = await s.call_tool("read_reference", {"problem": "../../../etc/passwd"})
        both = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "candidate": "relu_good.py"})
        trials = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 0})
        return outside, escape, both, trials

    outside, escape, both, trials = run(with_stdio(body, cache=str(tmp_path / "cache")))
    for result, piece in ((outside, "outside the server's roots"), (escape, "`..` is not allowed"),
                          (both, "not both"), (trials, "`trials` must be")):
        assert result.is_error and piece in text(result), text(result)
        assert "Traceback" not in text(result) and "ka-canary-mcp" not in text(result)


def test_a_cancelled_evaluation_dies_and_the_next_request_works(tmp_path):
    progress = []

    async def on_progress(value, total, message):
        progress.append((value, message))

    async def body(s):
        task = asyncio.ensure_future(s.call_tool("evaluate", {"problem": "relu_problem.py",
                                                             "candidate": "hangs.py", "trials": 1},
                                                 progress_callback=on_progress))
        await asyncio.sleep(8)  # the candidate is hanging in its forward now
        assert progress and progress[-1][1].startswith("evaluating: "), progress  # progress while it runs
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.monotonic()
        after = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 1})
        return after, time.monotonic() - started

    after, seconds = run(with_stdio(body, cache=str(tmp_path / "cache")))
    assert after.structured_content["status"] == "correct"
    assert seconds < 90, f"the next evaluation waited {seconds:.0f} s: the hung job still held the harness"


def test_the_session_budget_runs_out_with_a_clear_error(tmp_path):
    async def body(s):
        first = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 1})
        second = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 1})
        return first, second

    first, second = run(with_stdio(body, "--max-evaluations", "1", cache=str(tmp_path / "cache")))
    assert not first.is_error
    assert second.is_error and "evaluation budget is spent (1/1 evaluations)" in text(second)


def test_a_hostile_candidate_gets_the_verdict_eval_gives(tmp_path):
    hostile = ADVERSARIAL / "c01_torch_relu.py"
    env = {**os.environ, **ENV, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "kernelagent", "eval", str(CANDIDATES / "relu_problem.py"),
                           str(hostile), "--json", "--device", "cpu", "--trials", "2"], capture_output=True,
                          text=True, env=env, timeout=300)
    expected = json.loads(proc.stdout.strip().splitlines()[-1])

    async def body(s):
        return await s.call_tool("evaluate", {"problem": "relu_problem.py", "candidate": str(hostile), "trials": 2})

    result = run(with_stdio(body, cache=str(tmp_path / "cache")))
    assert result.structured_content["status"] == expected["status"] == "rejected"
    kinds = {f["kind"] for f in result.structured_content["flags"] if f["severity"] == "reject"}
    assert kinds == {f["kind"] for f in expected["flags"] if f["severity"] == "reject"} and kinds


def first_line(proc: subprocess.Popen, timeout: float = 90) -> str:
    """The first line the server prints on stdout, waited for at most `timeout` seconds ("" if none)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        return proc.stdout.readline() if sel.select(timeout) else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streamable_http_with_a_bearer_token(tmp_path):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    port = _free_port()
    env = {**os.environ, **ENV, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, *server_args("--http", f"127.0.0.1:{port}", "--token", "t0ken")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        first = first_line(proc)  # said once it listens
        assert first == f"kernelagent mcp: listening on {url} (bearer token required)\n", \
            (first, proc.poll(), proc.stderr.read()[-2000:] if proc.poll() is not None else "")
        refused = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401

        async def body():
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer t0ken"}, timeout=120) as client:
                async with streamable_http_client(url, http_client=client) as (read, write, *_):
                    async with ClientSession(read, write) as s:
                        await s.initialize()
                        names = {t.name for t in (await s.list_tools()).tools}
                        result = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD,
                                                                "trials": 1})
                        return names, result

        names, result = run(body())
        assert "evaluate" in names and result.structured_content["status"] == "correct"
    finally:
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-2000:]  # SIGTERM is a clean stop
    assert stdout.splitlines() == ["kernelagent mcp: stopped"], stdout  # said once, last


def test_http_says_where_it_listens_and_that_ctrl_c_stopped_it(tmp_path):
    """`kernelagent mcp --http` printed nothing at start or stop: a user could not tell it was up."""
    port = _free_port()
    env = {**os.environ, **ENV, "KERNELAGENT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, *server_args("--http", f"127.0.0.1:{port}")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        first = first_line(proc)
        assert first == f"kernelagent mcp: listening on http://127.0.0.1:{port}/mcp (no token: this machine only)\n", \
            (first, proc.poll())
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it does listen there
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (stdout, stderr)
    assert stderr.strip().splitlines()[-1] == "kernelagent mcp: interrupted, stopped", stderr
    assert stdout == "" and "Traceback" not in stderr


def test_cli_refuses_a_public_address_without_a_token_and_a_missing_root(tmp_path):
    from typer.testing import CliRunner

    from kernelagent.cli import app

    public = CliRunner().invoke(app, ["mcp", "--http", "0.0.0.0:8765", "--problems", str(CANDIDATES)])
    assert public.exit_code == 2 and "give --token" in public.stderr
    missing = CliRunner().invoke(app, ["mcp", "--problems", str(CANDIDATES), "--root", "/nonexistent/folder"])
    assert missing.exit_code == 2 and "not a folder" in missing.stderr
    bad = CliRunner().invoke(app, ["mcp", "--http", "nohost", "--problems", str(CANDIDATES)])
    assert bad.exit_code == 2 and "HOST:PORT" in bad.stderr
    # The server trusts problems only from --problems, and a folder the client writes may not overlap one.
    none = CliRunner().invoke(app, ["mcp", "--root", str(tmp_path)])
    assert none.exit_code == 2 and "give --problems DIR" in none.stderr
    (tmp_path / "sub").mkdir()
    overlap = CliRunner().invoke(app, ["mcp", "--problems", str(tmp_path), "--root", str(tmp_path / "sub")])
    assert overlap.exit_code == 2 and "overlaps --problems" in overlap.stderr

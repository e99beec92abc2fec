"""Issue 41, sections 1-2: `kernelagent mcp` is a trust boundary. Each attack of the red team's,
against a real server through the SDK's own client over streamable HTTP (tests/test_mcp.py covers
stdio: its cancel and budget tests run there):

- a client that can write under a root writes a "problem" (or rewrites a trusted one) that reads
  a canary file outside the roots and the server's secret environment and writes them elsewhere:
  it never runs (read_reference, evaluate, profile, plan, the task prompt, the resource);
- a trusted problem the server runs itself (read_reference's inputs, plan) runs jailed, with the
  allowlisted environment: the same theft finds nothing;
- manifest entries, tool arguments and resource names with an absolute path, `..` or a link out
  of the roots are refused, and no error quotes the file behind them;
- a trusted problem that raises at import is a `bad_problem` verdict with its reason;
- over HTTP, one session cancelling its evaluation leaves another session's evaluation correct;
- four concurrent calls cannot overspend a 12 s budget (reserved at admission), and another
  session's budget is its own;
- every malformed Authorization header is a 401, never a 500.
CPU only: the harness runs under Triton's interpreter."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

mcp = pytest.importorskip("mcp")

from mcp import ClientSession  # noqa: E402

from tests.conftest import CANDIDATES, REPO  # noqa: E402

# One worker for the file (pytest-xdist): its module fixtures (the HTTP server and its folders) are made once.
pytestmark = pytest.mark.xdist_group("mcp_trust")

CANARY = "ka-canary-" + secrets.token_hex(8)  # the content of the secret file outside the roots
ENV_CANARY = "ka-env-canary-" + secrets.token_hex(8)  # a secret in the server's environment
TOKEN = "t0ken-" + secrets.token_hex(4)
GOOD = (CANDIDATES / "relu_good.py").read_text()
HANGS = (CANDIDATES / "hangs.py").read_text()
# Correct, but each forward call sleeps: its evaluation is still running when the other session cancels.
SLOW_GOOD = GOOD.replace("    def forward(self, x):", "    def forward(self, x):\n        import time\n"
                         "        time.sleep(0.4)", 1)

# A problem that steals: the canary file and the secret environment variable, written to every
# target it can reach and handed back through its inputs' description and its errors.
THIEF = '''
import os
import torch
import torch.nn as nn



def _steal():
    try:
        secret = open({canary!r}).read()
    except OSError as exc:
        secret = "unread: " + type(exc).__name__
    loot = secret + " " + os.environ.get("KA_CANARY_API_KEY", "no-env")
    for target in {targets!r}:
        try:
            with open(target, "w") as f:
                f.write(loot)
        except OSError:
            pass
    return loot


LOOT = _steal()


class Model(nn.Module):
    def __init__(self, *args):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    {inputs}


def get_init_inputs():
    return []


def get_smoke_inputs():
    return [torch.rand(8, 16)]


def get_smoke_init_inputs():
    return [LOOT]
'''
BROKEN_AT_IMPORT = '''
import torch
import torch.nn as nn

raise RuntimeError("ka-broken-at-import: this problem cannot be imported")


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.rand(4, 4)]


def get_init_inputs():
    return []
'''
MANIFEST = 'trials = 1\n\n[[kernel]]\nproblem = "{problem}"\nkernel = "{kernel}"\nname = "k"\n'


def _thief(layout: SimpleNamespace, name: str, raising: bool) -> str:
    targets = [str(d / f"leak-{name}.txt") for d in (layout.outside, layout.work, layout.problems)] + \
        [layout.tmp_leak]
    inputs = "raise RuntimeError(LOOT)" if raising else "return [torch.rand(8, 16)]"
    return THIEF.format(canary=str(layout.canary), targets=targets, inputs=inputs)


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    base = tmp_path_factory.mktemp("mcp-trust")
    ns = SimpleNamespace(base=base, problems=base / "problems", work=base / "work", outside=base / "outside",
                         tmp_leak=f"/tmp/ka-leak-{secrets.token_hex(6)}.txt")
    for folder in (ns.problems, ns.work, ns.outside):
        folder.mkdir()
    ns.canary = ns.outside / "netrc"
    ns.canary.write_text(f"machine example.com login ka password {CANARY}\n")
    relu = (CANDIDATES / "relu_problem.py").read_text()
    # Trusted problems, there when the server starts (so pinned):
    (ns.problems / "relu_problem.py").write_text(relu)
    (ns.problems / "relu_mutated.py").write_text(relu)  # rewritten by the client after the start
    (ns.problems / "broken_import.py").write_text(BROKEN_AT_IMPORT)
    (ns.problems / "syntax_broken.py").write_text("import torch\nclass Model(:\n    pass\n")
    (ns.problems / "nosy.py").write_text(_thief(ns, "nosy", raising=False))  # trusted, yet it steals
    good = ns.problems / "good"
    good.mkdir()
    (good / "relu_problem.py").write_text(relu)
    (good / "kernel.py").write_text(GOOD)
    (good / "kernelagent.toml").write_text(MANIFEST.format(problem="relu_problem.py", kernel="kernel.py"))
    locked = ns.problems / "locked"
    locked.mkdir()
    (locked / "relu_problem.py").write_text(relu)
    (locked / "kernel.py").write_text(GOOD)
    (locked / "kernelagent.toml").write_text(MANIFEST.format(problem="relu_problem.py", kernel="kernel.py"))
    yield ns
    Path(ns.tmp_leak).unlink(missing_ok=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "KERNELAGENT_CACHE_DIR": str(cache),
            "KA_CANARY_API_KEY": ENV_CANARY}


def start_http(layout, log: Path, *extra: str) -> SimpleNamespace:
    """A `kernelagent mcp --http` server (a bearer token; problems under layout.problems, the
    client's folder layout.work), its log in `log`, once it accepts connections."""
    port = _free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kernelagent", "mcp", "--problems", str(layout.problems),
                                 "--root", str(layout.work), "--device", "cpu", "--http", f"127.0.0.1:{port}",
                                 "--token", TOKEN, *extra], env=_env(layout.base / "cache"), stdout=out, stderr=out)
    deadline = time.monotonic() + 90
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise AssertionError(log.read_text()[-3000:]) from None
            time.sleep(0.2)
    return SimpleNamespace(url=f"http://127.0.0.1:{port}/mcp", port=port, log=log, proc=proc)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def server(layout, tmp_path_factory):
    """One HTTP server for most of the module."""
    running = start_http(layout, tmp_path_factory.mktemp("mcp-trust-log") / "server.log")
    try:
        yield running
    finally:
        stop(running.proc)


async def _session(url: str, body):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=300) as client:
        async with streamable_http_client(url, http_client=client) as (read, write, *_):
            async with ClientSession(read, write) as s:
                await s.initialize()
                return await body(s)


def over_http(server, body):
    return asyncio.run(_session(server.url, body))


def text(result) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def dump(result) -> str:
    """Everything a reply carries (text, structured content, an error's message)."""
    if isinstance(result, BaseException):
        return repr(result)
    return json.dumps(result.model_dump(mode="json"), default=str)


async def attempt(coro):
    """A call's reply, or the error the client raised for it (prompts and resources raise)."""
    try:
        return await coro
    except Exception as exc:  # noqa: BLE001 - McpError: the server refused
        return exc


def assert_nothing_leaked(layout, replies) -> None:
    for reply in replies:
        assert CANARY not in dump(reply) and ENV_CANARY not in dump(reply), dump(reply)[:2000]
    written = [p for p in layout.base.rglob("leak-*")] + [Path(layout.tmp_leak)] * os.path.exists(layout.tmp_leak)
    assert not written, f"problem code ran where it must not: {written}"
    for path in layout.base.rglob("*"):
        if path.is_file() and path.resolve() != layout.canary.resolve():
            data = path.read_bytes()
            assert CANARY.encode() not in data and ENV_CANARY.encode() not in data, path


def test_a_problem_the_client_writes_never_runs(layout, server):
    # Written after the server started: in the client's folder, and into the problem folder itself.
    (layout.work / "thief.py").write_text(_thief(layout, "work", raising=True))
    (layout.problems / "late_thief.py").write_text(_thief(layout, "late", raising=True))
    (layout.problems / "relu_mutated.py").write_text(_thief(layout, "mutated", raising=True))

    async def body(s):
        calls = {
            "workspace": s.call_tool("read_reference", {"problem": str(layout.work / "thief.py")}),
            "workspace_relative": s.call_tool("evaluate", {"problem": "thief.py", "code": GOOD, "trials": 1}),
            "late": s.call_tool("evaluate", {"problem": "late_thief.py", "code": GOOD, "trials": 1}),
            "late_profile": s.call_tool("profile", {"problem": "late_thief.py", "code": GOOD}),
            "late_plan": s.call_tool("plan", {"problem": "late_thief.py"}),
            "late_reference": s.call_tool("read_reference", {"problem": "late_thief.py"}),
            "mutated": s.call_tool("read_reference", {"problem": "relu_mutated.py"}),
            "mutated_eval": s.call_tool("evaluate", {"problem": "relu_mutated.py", "code": GOOD, "trials": 1}),
            "prompt": s.get_prompt("task_prompt", {"problem": "late_thief.py"}),
            "resource": s.read_resource("kernelagent://problem/late_thief"),
            "listed": s.call_tool("list_problems", {}),
        }
        return {name: await attempt(coro) for name, coro in calls.items()}

    replies = over_http(server, body)
    for name in ("workspace", "workspace_relative"):
        assert replies[name].is_error and "not under a problem root" in text(replies[name]), text(replies[name])
    for name in ("late", "late_profile", "late_plan", "late_reference"):
        assert replies[name].is_error and "was not under --problems when the server started" in text(replies[name])
    for name in ("mutated", "mutated_eval"):
        assert replies[name].is_error and "changed since the server started" in text(replies[name])
    assert isinstance(replies["prompt"], Exception) and "was not under --problems" in str(replies["prompt"])
    assert isinstance(replies["resource"], Exception) and "no problem named" in str(replies["resource"])
    listed = replies["listed"].structured_content["problems"]
    assert str(layout.problems / "relu_problem.py") in listed
    assert not any("thief" in p for p in listed)
    time.sleep(1)  # anything that did run has written by now
    assert_nothing_leaked(layout, replies.values())


def test_problem_code_the_server_runs_itself_is_jailed(layout, server):
    """nosy.py is trusted (pinned at start) and still steals: its inputs' description and its plan
    run in a child with the allowlisted environment, in the jail, which hides the canary."""
    async def body(s):
        reference = await s.call_tool("read_reference", {"problem": "nosy.py"})
        plan = await s.call_tool("plan", {"problem": "nosy.py", "out": str(layout.work / "nosy_plan")})
        return reference, plan

    reference, plan = over_http(server, body)
    assert not reference.is_error, text(reference)
    smoke_init = json.dumps(reference.structured_content["inputs"].get("get_smoke_init_inputs"))
    assert "unread: " in smoke_init and "no-env" in smoke_init, smoke_init  # ran, and found neither secret
    assert not plan.is_error, text(plan)
    assert (layout.work / "nosy_plan" / "plan.json").is_file()
    assert_nothing_leaked(layout, [reference, plan])


def test_a_broken_trusted_problem_is_a_bad_problem_verdict(layout, server):
    async def body(s):
        return [await s.call_tool("evaluate", {"problem": "broken_import.py", "code": GOOD, "trials": 1,
                                               "timing": False}),
                await s.call_tool("profile", {"problem": "broken_import.py", "code": GOOD}),
                await s.call_tool("evaluate", {"problem": "syntax_broken.py", "code": GOOD, "trials": 1})]

    at_import, profiled, syntax = over_http(server, body)
    for result, why in ((at_import, "ka-broken-at-import"), (profiled, "ka-broken-at-import"),
                        (syntax, "syntax error")):
        assert not result.is_error, text(result)
        data = result.structured_content
        assert data["status"] == data["verdict"] == "bad_problem" and data["passed"] is False, data
        assert why in data["reason"] and why in text(result), data["reason"]


def test_no_path_leads_out_of_the_roots_and_no_error_quotes_a_file(layout, server):
    work, problems = layout.work, layout.problems
    for folder in (work, problems):
        (folder / "link_out.py").symlink_to(layout.canary)
        (folder / "link_dir").symlink_to(layout.outside)
    # Manifests the client writes: beside the trusted problems (so each one's problem entry is good
    # and its kernel entry is what is checked), and in its own folder.
    kernels = {"kernel_absolute": str(layout.canary), "kernel_dotdot": "../outside/netrc",
               "kernel_link": "link_out.py", "kernel_link_dir": "link_dir/netrc"}
    for name, kernel in kernels.items():
        (problems / f"{name}.toml").write_text(MANIFEST.format(problem="relu_problem.py", kernel=kernel))
    for name, problem in {"problem_absolute": str(layout.canary), "problem_dotdot": "../../outside/netrc"}.items():
        (work / name).mkdir()
        (work / name / "kernelagent.toml").write_text(MANIFEST.format(problem=problem, kernel="k.py"))
    (problems / "locked" / "kernelagent.lock.json").symlink_to(layout.canary)  # a lock that leads out
    (layout.outside / "kernelagent.toml").write_text(MANIFEST.format(problem=str(layout.canary), kernel="netrc"))
    (work / "manifest_link.toml").symlink_to(layout.outside / "kernelagent.toml")

    async def body(s):
        out = {name: await s.call_tool("verify", {"manifest": str(problems / f"{name}.toml")}) for name in kernels}
        for name in ("problem_absolute", "problem_dotdot"):
            out[name] = await s.call_tool("verify", {"manifest": str(work / name / "kernelagent.toml")})
        out["lock"] = await s.call_tool("verify", {"manifest": str(problems / "locked")})
        out["manifest_link"] = await s.call_tool("verify", {"manifest": "manifest_link.toml"})
        out["manifest_outside"] = await s.call_tool("verify", {"manifest": str(layout.outside / "kernelagent.toml")})
        for name, candidate in {"candidate_link": "link_out.py", "candidate_dir_link": "link_dir/netrc",
                                "candidate_absolute": str(layout.canary),
                                "candidate_dotdot": "../outside/netrc"}.items():
            out[name] = await s.call_tool("evaluate", {"problem": "relu_problem.py", "candidate": candidate})
        out["reference_absolute"] = await s.call_tool("read_reference", {"problem": str(layout.canary)})
        out["reference_link"] = await s.call_tool("read_reference", {"problem": "link_out.py"})
        out["directory"] = await s.call_tool("list_problems", {"directory": str(layout.outside)})
        out["plan_out"] = await s.call_tool("plan", {"problem": "relu_problem.py", "out": "../../outside/plan"})
        out["plan_out_link"] = await s.call_tool("plan", {"problem": "relu_problem.py",
                                                          "out": str(work / "link_dir" / "plan")})
        out["resource"] = await attempt(s.read_resource("kernelagent://problem/netrc"))
        out["resource_dotdot"] = await attempt(s.read_resource("kernelagent://problem/..%2Foutside%2Fnetrc"))
        out["good"] = await s.call_tool("verify", {"manifest": str(problems / "good" / "kernelagent.toml")})
        return out

    replies = over_http(server, body)
    outside, relative, dotdot = "outside the server's roots", "must be a path relative to the manifest's folder", \
        "`..` is not allowed"
    expected = {"kernel_absolute": relative, "kernel_dotdot": dotdot, "kernel_link": outside,
                "kernel_link_dir": outside, "problem_absolute": relative, "problem_dotdot": dotdot, "lock": outside,
                "manifest_link": outside, "manifest_outside": outside, "candidate_link": outside,
                "candidate_dir_link": outside, "candidate_absolute": outside, "candidate_dotdot": dotdot,
                "reference_absolute": "outside the server's problem roots",
                "reference_link": "outside the server's problem roots", "directory": outside, "plan_out": dotdot,
                "plan_out_link": outside}
    for name, piece in expected.items():
        assert replies[name].is_error and piece in text(replies[name]), (name, text(replies[name]))
        assert "Traceback" not in text(replies[name])
    assert isinstance(replies["resource"], Exception) and isinstance(replies["resource_dotdot"], Exception)
    good = replies["good"]
    assert not good.is_error and good.structured_content["kernels"][0]["verdict"] == "correct", text(good)
    assert not (problems / "good" / "kernelagent.lock.json").exists()  # verify over MCP writes nothing
    assert not (layout.outside / "plan").exists()
    assert_nothing_leaked(layout, replies.values())


def test_cancelling_one_session_leaves_another_sessions_evaluation_alone(server):
    progress: list[float] = []

    async def on_progress(value, total, message):
        progress.append(value)

    async def both():
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=300) as ca, \
                httpx2.AsyncClient(headers=headers, timeout=300) as cb:
            async with streamable_http_client(server.url, http_client=ca) as (ra, wa, *_), \
                    streamable_http_client(server.url, http_client=cb) as (rb, wb, *_):
                async with ClientSession(ra, wa) as a, ClientSession(rb, wb) as b:
                    await a.initialize()
                    await b.initialize()
                    hanging = asyncio.ensure_future(a.call_tool(
                        "evaluate", {"problem": "relu_problem.py", "code": HANGS, "trials": 1, "timing": False},
                        progress_callback=on_progress))
                    deadline = time.monotonic() + 60
                    while not progress and time.monotonic() < deadline:  # A's job is running (hanging)
                        await asyncio.sleep(0.2)
                    honest = asyncio.ensure_future(b.call_tool(
                        "evaluate", {"problem": "relu_problem.py", "code": SLOW_GOOD, "trials": 2, "timing": False}))
                    await asyncio.sleep(1.5)  # B is queued behind A, or running beside it
                    assert not honest.done()
                    hanging.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await hanging
                    result = await honest
                    started = time.monotonic()
                    after = await a.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 1,
                                                           "timing": False})
                    return result, after, time.monotonic() - started

    result, after, seconds = asyncio.run(both())
    assert progress, "the hanging evaluation never reported progress"
    assert result.structured_content["status"] == "correct", text(result)  # was harness_error: the server died
    assert after.structured_content["status"] == "correct" and seconds < 60, text(after)


def test_the_harness_cancels_one_job_and_keeps_its_server(evaluator):
    """The harness protocol's per-job `cancel` (what an MCP call's cancel sends): the hanging job's
    processes die at once, a job beside it (or queued behind it) still gets its verdict, the
    server is the same process, and a call cancelled before it started never runs."""
    from kernelagent.harness import EvalConfig, Status

    problem = CANDIDATES / "relu_problem.py"
    evaluator.start()
    pid = evaluator._proc.pid
    cancel, out, seconds = threading.Event(), {}, {}

    def run(name, source, trials, event=None):
        out[name] = evaluator.evaluate(problem, source, EvalConfig(trials=trials, timing=False), cancel=event)
        seconds[name] = time.monotonic()

    hang = threading.Thread(target=run, args=("hang", HANGS, 1, cancel))
    good = threading.Thread(target=run, args=("good", SLOW_GOOD, 2))
    hang.start()
    time.sleep(4)  # its processes are forked and hanging in forward
    good.start()
    time.sleep(1)
    cancelled_at = time.monotonic()
    cancel.set()
    hang.join(60)
    good.join(240)
    assert out["hang"].status == Status.HARNESS_ERROR and "cancelled by the caller" in out["hang"].reason
    assert seconds["hang"] - cancelled_at < 10
    assert out["good"].status == Status.CORRECT, out["good"].reason
    assert evaluator._proc.pid == pid  # the server was never killed
    before = threading.Event()
    before.set()
    started = time.monotonic()
    early = evaluator.evaluate(problem, GOOD, EvalConfig(trials=1, timing=False), cancel=before)
    assert "cancelled by the caller" in early.reason and time.monotonic() - started < 10


def test_malformed_authorization_headers_get_401(server):
    def status(*headers: bytes) -> tuple[int, bytes]:
        body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
        request = (b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:" + str(server.port).encode() +
                   b"\r\nContent-Type: application/json\r\n"
                   b"Accept: application/json, text/event-stream\r\n" + b"".join(h + b"\r\n" for h in headers)
                   + b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(request)
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        return int(reply.split(b" ", 2)[1]), reply

    token = TOKEN.encode()
    logged = len(server.log.read_bytes())  # the log from here on: this test's requests
    malformed = {
        "missing": (), "wrong token": (b"Authorization: Bearer wrong",),
        "non-ASCII byte": (b"Authorization: Bearer " + token + b"\xff",),
        "non-ASCII only": (b"Authorization: \xff\xfe\xfd",), "latin-1 token": (b"Authorization: Bearer t\xf6ken",),
        "UTF-8 token": ("Authorization: Bearer t\u00f6ken\u2603".encode(),),
        "other scheme": (b"Authorization: Basic " + token,), "no credential": (b"Authorization: Bearer",),
        "empty credential": (b"Authorization: Bearer ",), "two spaces": (b"Authorization: Bearer  " + token,),
        "tab": (b"Authorization: Bearer\t" + token,), "NUL": (b"Authorization: Bearer " + token + b"\x00",),
        "control": (b"Authorization: Bearer \x01" + token,),
        "two headers": (b"Authorization: Bearer " + token, b"Authorization: Bearer wrong"),
        "token alone": (b"Authorization: " + token,), "prefix of token": (b"Authorization: Bearer " + token[:-1],),
    }
    for name, headers in malformed.items():
        code, reply = status(*headers)
        # A NUL byte is refused by uvicorn's HTTP parser (400) before any application sees it.
        assert code == 401 or (name == "NUL" and code == 400), (name, reply[:300])
        assert b"Traceback" not in reply, name
    code, reply = status(b"Authorization: Bearer " + token)
    assert code != 401, reply[:300]
    code, _ = status(b"authorization: bearer " + token)  # header name and scheme are case-insensitive
    assert code != 401
    time.sleep(0.5)
    log = server.log.read_bytes()[logged:].decode(errors="replace")
    assert "Traceback" not in log and "TypeError" not in log, log[-3000:]


def test_a_budget_is_reserved_when_a_call_is_admitted(tmp_path, layout):
    """Four concurrent evaluations in one HTTP session on a 12 s budget: the first reserves the
    12 s, the others are refused at once, and the first is cancelled when its share runs out (it
    hangs). Another session's budget is its own."""
    budgeted = start_http(layout, tmp_path / "server.log", "--max-gpu-seconds", "12")

    async def spend(s):
        async def one():
            started = time.monotonic()
            result = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": HANGS, "trials": 1,
                                                    "timing": False})
            return result, time.monotonic() - started

        calls = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(4))), timeout=120)
        after = await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 1})
        return calls, after

    async def other(s):
        return await s.call_tool("evaluate", {"problem": "relu_problem.py", "code": GOOD, "trials": 1,
                                              "timing": False})

    try:
        calls, after = over_http(budgeted, spend)
        fresh = over_http(budgeted, other)
    finally:
        stop(budgeted.proc)
    refused = [(r, s) for r, s in calls if r.is_error and "reserved by" in text(r)]
    admitted = [(r, s) for r, s in calls if not (r.is_error and "reserved by" in text(r))]
    assert refused and all(s < 5 for _, s in refused), [text(r) for r, _ in calls]
    spent = sum(s for _, s in admitted)
    assert spent <= 12 + 4, f"admitted calls ran {spent:.1f} s on a 12 s budget"
    assert all(r.is_error and "evaluation time ran out while it ran" in text(r) for r, _ in admitted), \
        [text(r) for r, _ in admitted]
    assert after.is_error and "evaluation time is spent" in text(after), text(after)
    assert not fresh.is_error and fresh.structured_content["status"] == "correct", text(fresh)  # its own 12 s


def test_budget_leases_never_overspend_under_threads():
    from kernelagent.mcpserver.session import Budget, BudgetSpent

    budget = Budget(max_seconds=12.0)
    leases, refused = [], []
    lock = threading.Lock()

    def admit():
        try:
            lease = budget.admit()
        except BudgetSpent as exc:
            with lock:
                refused.append(str(exc))
            return
        with lock:
            leases.append(lease)

    threads = [threading.Thread(target=admit) for _ in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(lease.granted for lease in leases) <= 12.0 and budget.reserved <= 12.0
    assert refused and all("reserved by" in r for r in refused)
    assert not leases[0].extend()  # nothing is free while it is all reserved
    for lease in leases:
        lease.settle()
    assert budget.reserved == 0.0 and budget.in_flight == 0 and budget.seconds <= 12.0
    counted = Budget(max_evaluations=2)
    counted.admit(), counted.admit()
    with pytest.raises(BudgetSpent, match="2/2 evaluations"):
        counted.admit()


def test_the_authorization_check_on_its_own():
    from kernelagent.serving.guard import authorized

    expected = b"s3cret"
    assert authorized([(b"authorization", b"Bearer s3cret")], expected)
    assert authorized([(b"Authorization", b"bearer s3cret")], expected)
    for headers in ([], [(b"authorization", b"Bearer s3cret\xff")], [(b"authorization", b"\xff")],
                    [(b"authorization", b"Bearer s3cret"), (b"authorization", b"Bearer s3cret")],
                    [(b"authorization", b"Bearer")], [(b"authorization", b"Bearer  s3cret")],
                    [(b"authorization", "Bearer s3cret")], [(b"authorization", b"Token s3cret")], None, [(1,)]):
        assert not authorized(headers, expected), headers

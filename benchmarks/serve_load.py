"""Load on both HTTP servers (`kernelagent serve` and `kernelagent mcp --http`), all on 127.0.0.1,
in bounded loops: many trainers (or MCP sessions) at once, and beside them the clients a server
must survive: heads and bodies that stall or trickle, oversized bodies (with and without `Expect:
100-continue`, with and without a length), malformed heads, bad tokens, idle connections, and
clients that disconnect mid-batch. Reports requests, concurrency, answers by status, p50/p99
latency per kind of client, and what was left: unanswered requests, requests over the bound,
statuses nobody documented, completions still pending and connections still open.

    python benchmarks/serve_load.py                                  # both, the harness a stand-in
    python benchmarks/serve_load.py --server serve --trainers 64 --batches 8 --batch 8
    python benchmarks/serve_load.py --harness cpu --trainers 4 --batches 2 --batch 2   # the real CPU harness

The stand-in (the default) scores a completion in `--eval-ms` on `--workers` threads, so the
figures are the HTTP layer's: the guard, uvicorn and the service around the harness. Its reward
is a hash of the completion's text, so an answer sent to the wrong trainer would show. The
servers run in this process (a thread each), so client and server share one interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import select
import socket
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

TOKEN = "load-t0ken"
MCP_ACCEPT = "application/json, text/event-stream"


# -- stand-ins for the harness ------------------------------------------------------------------
def standin_value(text: str) -> float:
    return float(zlib.crc32(text.encode()) % 1000)


class StandInBackend:
    """submit() like EvaluatorPool's: a future, scored in `eval_ms` on `workers` threads."""

    def __init__(self, eval_ms: float, workers: int) -> None:
        self.eval_s, self.devices = eval_ms / 1000, ["stand-in"] * workers
        self.started = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stand-in")

    def submit(self, problem, code, config=None):
        return self._pool.submit(self._run, code)

    def _run(self, code: str) -> float:
        self.started += 1
        time.sleep(self.eval_s)
        return standin_value(code)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def standin_service(eval_ms: float, workers: int, **kwargs):
    from kernelagent.rl.reward import RewardBreakdown
    from kernelagent.rl.service import RewardService
    from kernelagent.rl.trl import KernelReward

    class StandInReward(KernelReward):
        def prepare(self, completions, columns):
            return {"rows": list(range(len(completions))), "jobs": [(None, str(c), None) for c in completions]}

        def rewards(self, prepared, results):
            return [RewardBreakdown(reward=r, verifiable=r, status="correct") if isinstance(r, float)
                    else RewardBreakdown(reward=0.0, verifiable=0.0, status="harness_error", infra_error=True)
                    for r in results]

    backend = StandInBackend(eval_ms, workers)
    reward = StandInReward(backend, own_backend=True)
    return RewardService(reward, **kwargs), backend


def cpu_service(workers: int, **kwargs):
    from kernelagent.harness import EvalConfig
    from kernelagent.rl.service import RewardService
    from kernelagent.rl.trl import KernelReward

    config = EvalConfig(trials=2, target_ms=10, warmup_ms=2, max_reps=10)
    reward = KernelReward(devices=["cpu"] * workers, eval_config=config)
    return RewardService(reward, **kwargs), reward


def standin_mcp():
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("stand-in")

    @server.tool(description="Wait `ms`, then give `tag` back.")
    async def work(tag: str, ms: int = 0) -> dict:
        await asyncio.sleep(ms / 1000)
        return {"tag": tag}

    return server


# -- clients ----------------------------------------------------------------------------------
@dataclass
class Tally:
    """Answers by kind of client: statuses and latencies."""

    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    latency: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    wrong: list = field(default_factory=list)  # an answer that is not the request's own
    verdicts: Counter = field(default_factory=Counter)  # the harness's, with the real one
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, status, seconds: float) -> None:
        with self.lock:
            self.statuses[kind][status] += 1
            self.latency[kind].append(seconds)


def raw(port: int, head: bytes, body=b"", *, trickle: float | None = None, piece: int = 1,
        leave_after: float | None = None, timeout: float = 30.0) -> int | str:
    """Send `head` then `body` (all at once, or `piece` bytes every `trickle` s), then read the answer:
    its status, or "closed" (no answer), "reset", "timeout", "left" (we hung up after `leave_after`)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            sock.sendall(head)
            if trickle is None:
                sock.sendall(body)
            else:
                for i in range(0, len(body), piece):
                    if select.select([sock], [], [], trickle)[0]:
                        break  # the server answered: stop sending
                    sock.sendall(body[i:i + piece])
        except (BrokenPipeError, ConnectionResetError):
            pass
        if leave_after is not None:
            time.sleep(leave_after)
            return "left"
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            if not data:
                return "reset"
        except socket.timeout:
            return "timeout"
        return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else "closed"
    finally:
        sock.close()


def head(method: str, path: str, *lines: str | bytes, length: int | None = None) -> bytes:
    out = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    out += [line.encode() if isinstance(line, str) else line for line in lines]
    if length is not None:
        out.append(f"Content-Length: {length}".encode())
    return b"\r\n".join(out) + b"\r\n\r\n"


def abuse(port: int, path: str, tally: Tally, *, max_body: int, read_timeout: float, token: str | None,
          rounds: int, timeout: float) -> None:
    """The clients a server must survive, `rounds` of each, at once; each kind's expected
    statuses are the documented ones (serving/guard.py STATUSES)."""
    auth = f"Authorization: Bearer {token}" if token else "X-No-Token: 1"
    ct = "Content-Type: application/json"
    acc = f"Accept: {MCP_ACCEPT}"
    big = max_body + 1
    cases = {
        "slow head": lambda: raw(port, f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode(), timeout=timeout),
        "idle connection": lambda: raw(port, b"", timeout=timeout),
        "body stops short": lambda: raw(port, head("POST", path, auth, ct, acc, length=100), b'{"comp', timeout=timeout),
        "body trickles": lambda: raw(port, head("POST", path, auth, ct, acc, length=400), b" " * 400,
                                     trickle=read_timeout / 20, timeout=timeout),
        "oversized": lambda: raw(port, head("POST", path, auth, ct, acc, length=big), b" " * big, timeout=timeout),
        "oversized, asks first": lambda: raw(port, head("POST", path, auth, ct, "Expect: 100-continue", length=big),
                                             timeout=timeout),
        "oversized, chunked": lambda: raw(port, head("POST", path, auth, ct, acc, "Transfer-Encoding: chunked"),
                                          f"{big:x}\r\n".encode() + b" " * big + b"\r\n0\r\n\r\n", timeout=timeout),
        "bad Content-Length": lambda: raw(port, head("POST", path, auth, "Content-Length: 12abc"), b"{}",
                                          timeout=timeout),
        "header without colon": lambda: raw(port, head("GET", path, auth, "NoColonHere"), timeout=timeout),
        "NUL in a header": lambda: raw(port, head("GET", path, auth, b"X-Bad: a\x00b"), timeout=timeout),
        "head over the limit": lambda: raw(port, head("GET", path, auth, "X-Big: " + "a" * 40_000), timeout=timeout),
        # An unterminated head sent in pieces, back to back (trickle 0: no pause between them). With
        # a 10 ms pause a loaded 2-core runner once starved the sender past the read timeout, and
        # the server rightly answered the slow head (408) before the head reached the limit.
        "head grows past the limit": lambda: raw(port, f"GET {path} HTTP/1.1\r\nX-Big: ".encode(), b"a" * 40_000,
                                                 trickle=0, piece=4096, timeout=timeout),
    }
    if token:
        cases |= {
            "no token": lambda: raw(port, head("POST", path, ct, acc, length=2), b"{}", timeout=timeout),
            "non-ASCII token": lambda: raw(port, head("POST", path, b"Authorization: Bearer \xff\xfe", ct, acc,
                                                      length=2), b"{}", timeout=timeout),
            "two tokens": lambda: raw(port, head("POST", path, auth, auth, ct, acc, length=2), b"{}",
                                      timeout=timeout),
        }

    def one(kind: str) -> None:
        started = time.monotonic()
        tally.add(kind, cases[kind](), time.monotonic() - started)

    with ThreadPoolExecutor(max_workers=len(cases) * rounds) as pool:
        list(pool.map(one, [kind for kind in cases for _ in range(rounds)]))


EXPECTED = {"slow head": {408}, "idle connection": {"closed"}, "body stops short": {408}, "body trickles": {408},
            "oversized": {413}, "oversized, asks first": {413}, "oversized, chunked": {413},
            "bad Content-Length": {400}, "header without colon": {400}, "NUL in a header": {400},
            "head over the limit": {431}, "head grows past the limit": {400}, "no token": {401}, "non-ASCII token": {401}, "two tokens": {401}}


def post_json(port: int, path: str, body: dict, headers: dict, timeout: float):
    """(status, headers, body bytes) of one POST on a fresh connection (as RemoteReward sends)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, response, response.read()
    finally:
        conn.close()


def trainer(port: int, t: int, tally: Tally, *, batches: int, batch: int, token: str | None, timeout: float,
            source: str | None = None, completion=None, tries: int = 200) -> None:
    """A trainer: `batches` batches of `batch` completions, each until served (429 and 503 are
    retried after a short wait, up to `tries` times)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for b in range(batches):
        texts = [f"trainer {t} batch {b} completion {i}" for i in range(batch)]
        completions = [completion(text) for text in texts] if completion else texts
        body = {"completions": completions, "problem_source": [source or "stand-in"] * batch}
        for _ in range(tries):
            started = time.monotonic()
            try:
                status, _, data = post_json(port, "/reward", body, headers, timeout)
            except (OSError, http.client.HTTPException) as exc:
                status, data = type(exc).__name__, b""
            tally.add("trainer", status, time.monotonic() - started)
            if status == 200:
                reply = json.loads(data)
                rewards = reply["rewards"]
                if completion is not None:
                    with tally.lock:
                        tally.verdicts.update(d["status"] for d in reply["details"])
                if completion is None and rewards != [standin_value(x) for x in texts]:
                    tally.wrong.append((t, b))
                if len(rewards) != batch:
                    tally.wrong.append((t, b))
                break
            if status not in (429, 503):
                break
            time.sleep(0.02)


def leaver(port: int, t: int, tally: Tally, *, batch: int, token: str | None, after: float, timeout: float) -> None:
    """A trainer that hangs up `after` seconds into its batch."""
    body = json.dumps({"completions": [f"leaver {t} completion {i}" for i in range(batch)],
                       "problem_source": ["stand-in"] * batch}).encode()
    lines = [f"Authorization: Bearer {token}"] if token else []
    started = time.monotonic()
    tally.add("disconnects mid-batch", raw(port, head("POST", "/reward", *lines, length=len(body)), body,
                                           leave_after=after, timeout=timeout), time.monotonic() - started)


def mcp_session(port: int, s: int, tally: Tally, *, calls: int, token: str | None, timeout: float,
                tool: str = "work", arguments=None, leave: bool = False) -> None:
    """An MCP session over raw HTTP on one keep-alive connection: initialize, initialized,
    `calls` tool calls (each answer checked against its own tag), DELETE; or, with `leave`, one
    call that it hangs up on before the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    base = {"Content-Type": "application/json", "Accept": MCP_ACCEPT}
    if token:
        base["Authorization"] = f"Bearer {token}"

    def rpc(message: dict, headers: dict, kind: str):
        started = time.monotonic()
        try:
            conn.request("POST", "/mcp", json.dumps(message), headers)
            response = conn.getresponse()
            status, data = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            status, response, data = type(exc).__name__, None, b""
        tally.add(kind, status, time.monotonic() - started)
        lines = [line[5:] for line in data.decode(errors="replace").splitlines() if line.startswith("data:")]
        return status, response, json.loads(lines[-1]) if lines else None

    try:
        status, response, reply = rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "load", "version": "1"}}},
            base, "mcp initialize")
        if status != 200:
            return
        headers = {**base, "Mcp-Session-Id": response.getheader("mcp-session-id"),
                   "Mcp-Protocol-Version": reply["result"]["protocolVersion"]}
        rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, headers, "mcp notification")
        if leave:
            started = time.monotonic()
            conn.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": tool, "arguments": arguments(f"session {s} leaving")}}), headers)
            time.sleep(0.05)
            tally.add("disconnects mid-call", "left", time.monotonic() - started)
            return
        for c in range(calls):
            tag = f"session {s} call {c}"
            args = arguments(tag) if arguments else {"tag": tag}
            status, _, reply = rpc({"jsonrpc": "2.0", "id": c + 1, "method": "tools/call",
                                    "params": {"name": tool, "arguments": args}}, headers, "mcp tool call")
            if status == 200 and (reply is None or (tool == "work" and tag not in json.dumps(reply))):
                tally.wrong.append((s, c))
            elif status == 200 and tool != "work":
                with tally.lock:
                    tally.verdicts[str((reply["result"].get("structuredContent") or {}).get("status"))] += 1
        conn.request("DELETE", "/mcp", headers=headers)
        conn.getresponse().read()
    finally:
        conn.close()


# -- runs -------------------------------------------------------------------------------------
def wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def quiet() -> None:
    """uvicorn's warnings (one per malformed request) and the SDK's session notes off the terminal."""
    import logging

    for name in ("uvicorn.error", "mcp"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run_serve(*, trainers: int = 32, batches: int = 4, batch: int = 8, eval_ms: float = 20, workers: int = 8,
              harness: str = "stand-in", abuse_rounds: int = 2, leavers: int = 4, read_timeout: float = 1.0,
              max_body: int = 64 * 1024, max_pending: int | None = None, max_connections: int | None = None,
              bound: float = 60.0) -> dict:
    """The reward service under load; its figures and what it left behind."""
    from kernelagent.rl.service import STATUSES as OWN
    from kernelagent.serving.guard import STATUSES as SHARED

    kwargs = dict(max_pending=max_pending or max(trainers * batch, 1), read_timeout=read_timeout,
                  max_body=max_body, token=TOKEN, request_timeout=bound, max_connections=max_connections)
    if harness == "cpu":
        service, backend = cpu_service(workers, **kwargs)
        source = (HERE / "level1" / "1_relu.py").read_text()
        solution = (HERE / "solutions" / "level1" / "1_relu.py").read_text()
        extra = dict(source=source, completion=lambda text: f"```python\n{solution}\n# {text}\n```")
    else:
        service, backend = standin_service(eval_ms, workers, **kwargs)
        extra = {}
    server = service.make_server("127.0.0.1", 0)
    quiet()
    server.start()
    port, tally = server.server_address[1], Tally()
    started = time.monotonic()
    try:
        jobs = [lambda t=t: trainer(port, t, tally, batches=batches, batch=batch, token=TOKEN, timeout=bound, **extra)
                for t in range(trainers)]
        if harness != "cpu":
            jobs += [lambda t=t: leaver(port, t, tally, batch=batch, token=TOKEN, after=eval_ms / 1000,
                                        timeout=bound) for t in range(leavers)]
        if abuse_rounds:
            jobs.append(lambda: abuse(port, "/reward", tally, max_body=max_body, read_timeout=read_timeout,
                                      token=TOKEN, rounds=abuse_rounds, timeout=bound))
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            for future in [pool.submit(job) for job in jobs]:
                future.result()
        wall = time.monotonic() - started
        settled = wait_until(lambda: service.pending == 0 and server.connections == 0,
                             read_timeout + service.limits.keep_alive + 5)
        health = service.health()
    finally:
        service.close()
    return summary("serve", tally, wall, {**SHARED, **OWN}, bound, trainers + leavers, settled, health,
                   started_jobs=getattr(backend, "started", None))


def run_mcp(*, sessions: int = 16, calls: int = 8, work_ms: float = 20, real: bool = False, abuse_rounds: int = 2,
            leavers: int = 4, read_timeout: float = 1.0, bound: float = 60.0, max_body: int | None = None) -> dict:
    """The MCP server's HTTP transport under load (a stand-in tool, or the real server's tools).
    `max_body` (default: the server's own, 4 MiB) is also what the oversized abusers send: a small
    one keeps the oversized chunked body inside a short read timeout on a busy host (4 MiB through
    the HTTP parser took past CI's 0.5 s on 2 loaded cores, and the guard rightly answered 408)."""
    from dataclasses import replace

    from kernelagent.mcpserver.http_app import LIMITS, STATUSES as OWN, http_server
    from kernelagent.serving.guard import STATUSES as SHARED

    limits = replace(LIMITS, read_timeout=read_timeout, max_body=max_body or LIMITS.max_body)
    harness = None
    if real:
        from kernelagent.mcpserver.server import build

        folder = Path(tempfile.mkdtemp(prefix="serve-load-"))
        (folder / "problems").mkdir()
        (folder / "work").mkdir()
        (folder / "problems" / "1_relu.py").write_text((HERE / "level1" / "1_relu.py").read_text())
        mcp, harness = build([folder / "problems"], [folder / "work"], device="cpu")
        solution = (HERE / "solutions" / "level1" / "1_relu.py").read_text()
        tool, arguments = "evaluate", (lambda tag: {"problem": "1_relu.py", "code": solution + f"\n# {tag}\n",
                                                    "trials": 1})
    else:
        mcp, tool = standin_mcp(), "work"
        arguments = (lambda tag: {"tag": tag, "ms": work_ms})
    server = http_server(mcp, "127.0.0.1", 0, TOKEN, limits)
    quiet()
    server.start()
    port, tally = server.server_address[1], Tally()
    started = time.monotonic()
    try:
        jobs = [lambda s=s: mcp_session(port, s, tally, calls=calls, token=TOKEN, timeout=bound, tool=tool,
                                        arguments=arguments) for s in range(sessions)]
        if not real:
            jobs += [lambda s=s: mcp_session(port, s, tally, calls=1, token=TOKEN, timeout=bound, tool=tool, leave=True,
                                             arguments=lambda tag: {"tag": tag, "ms": 10 * work_ms})
                     for s in range(sessions, sessions + leavers)]
        if abuse_rounds:
            jobs.append(lambda: abuse(port, "/mcp", tally, max_body=limits.max_body, read_timeout=read_timeout,
                                      token=TOKEN, rounds=abuse_rounds, timeout=bound))
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            for future in [pool.submit(job) for job in jobs]:
                future.result()
        wall = time.monotonic() - started
        settled = wait_until(lambda: server.connections == 0, read_timeout + limits.keep_alive + 5)
    finally:
        server.shutdown()
        server.server_close()
        if harness is not None:
            harness.close()
    return summary("mcp", tally, wall, {**SHARED, **OWN}, bound, sessions + leavers, settled, {})


def summary(name: str, tally: Tally, wall: float, documented: dict, bound: float, concurrency: int,
            settled: bool, health: dict, started_jobs: int | None = None) -> dict:
    def pct(values: list, q: float) -> float:
        values = sorted(values)
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1) if values else 0.0

    kinds = {kind: {"requests": sum(c.values()), "statuses": {str(k): v for k, v in sorted(c.items(), key=str)},
                    "p50_ms": pct(tally.latency[kind], 0.5), "p99_ms": pct(tally.latency[kind], 0.99),
                    "max_ms": pct(tally.latency[kind], 1.0)}
             for kind, c in sorted(tally.statuses.items())}
    every = Counter()
    for c in tally.statuses.values():
        every.update(c)
    honest = [x for kind, v in tally.latency.items() if kind not in EXPECTED and "disconnects" not in kind for x in v]
    undocumented = {str(s): n for s, n in every.items()
                    if s not in documented and s not in ("closed", "left")}
    unexpected = {kind: {str(s): n for s, n in tally.statuses[kind].items() if s not in EXPECTED[kind]}
                  for kind in tally.statuses if kind in EXPECTED}
    return {"server": name, "requests": sum(every.values()), "concurrency": concurrency, "wall_s": round(wall, 2),
            "statuses": {str(k): v for k, v in sorted(every.items(), key=str)},
            "p50_ms": pct(honest, 0.5), "p99_ms": pct(honest, 0.99),  # the trainers' or sessions' requests
            "kinds": kinds, "wrong_answers": len(tally.wrong), "undocumented": undocumented,
            "unexpected": {k: v for k, v in unexpected.items() if v},
            "over_bound": sum(x > bound for v in tally.latency.values() for x in v),
            "settled": settled, "pending_after": health.get("pending"), "disconnects": health.get("disconnects"),
            "evaluations_started": started_jobs, "verdicts": dict(tally.verdicts)}


def render(result: dict) -> str:
    out = [f"{result['server']}: {result['requests']} requests, {result['concurrency']} clients at once "
           f"(+ the abusive ones), {result['wall_s']} s; theirs: p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms",
           f"  {'client':<26} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  statuses"]
    for kind, k in result["kinds"].items():
        statuses = ", ".join(f"{s}: {n}" for s, n in k["statuses"].items())
        out.append(f"  {kind:<26} {k['requests']:>8} {k['p50_ms']:>8} {k['p99_ms']:>8} {k['max_ms']:>8}  {statuses}")
    out.append(f"  left behind: wrong answers {result['wrong_answers']}, undocumented {result['undocumented'] or 0}, "
               f"unexpected {result['unexpected'] or 0}, over the bound {result['over_bound']}, settled "
               f"{result['settled']} (pending {result['pending_after']}, disconnects {result['disconnects']}, "
               f"evaluations started {result['evaluations_started']})")
    if result["verdicts"]:
        out.append(f"  the harness's verdicts: {result['verdicts']}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=["serve", "mcp", "both"], default="both")
    parser.add_argument("--harness", choices=["stand-in", "cpu"], default="stand-in")
    parser.add_argument("--trainers", type=int, default=32, help="trainers (serve) or sessions (mcp) at once")
    parser.add_argument("--batches", type=int, default=4, help="batches per trainer (serve) or calls per session")
    parser.add_argument("--batch", type=int, default=8, help="completions per batch")
    parser.add_argument("--eval-ms", type=float, default=20, help="the stand-in's time per completion or call")
    parser.add_argument("--workers", type=int, default=8, help="the stand-in's (or the CPU harness's) evaluators")
    parser.add_argument("--abuse-rounds", type=int, default=2, help="clients of each abusive kind")
    parser.add_argument("--read-timeout", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    results = []
    if args.server in ("serve", "both"):
        results.append(run_serve(trainers=args.trainers, batches=args.batches, batch=args.batch, eval_ms=args.eval_ms,
                                 workers=args.workers, harness=args.harness, abuse_rounds=args.abuse_rounds,
                                 read_timeout=args.read_timeout, bound=600 if args.harness == "cpu" else 60))
        print(render(results[-1]), flush=True)
    if args.server in ("mcp", "both"):
        results.append(run_mcp(sessions=args.trainers, calls=args.batches, work_ms=args.eval_ms,
                               real=args.harness == "cpu", abuse_rounds=args.abuse_rounds,
                               read_timeout=args.read_timeout, bound=600 if args.harness == "cpu" else 60))
        print(render(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    bad = [r["server"] for r in results if r["wrong_answers"] or r["undocumented"] or r["unexpected"]
           or r["over_bound"] or not r["settled"]]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

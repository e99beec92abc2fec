"""An HTTP reward service: trainers on other machines send batches, the harness pool scores them.

    kernelagent serve --gpus 0,1,2,3 --port 8000

    POST /reward   {"completions": [...], "problem_source": [...]}        (TRL's columns)
                   or {"items": [{"completion": ..., "problem_source": ...}, ...]}
                   -> 200 {"rewards": [float | null, ...], "details": [...], "seconds": s}
    GET  /health   -> 200 {"status": "ok", "pending": n, "capacity": m, ...}

Backpressure: at most `max_pending` completions are admitted at once (queued or being
evaluated); a batch that would go past it is answered 429 with Retry-After, and one larger
than the whole capacity 413. Each request has a deadline (`request_timeout`, or the
request's own smaller "timeout"): past it the request is answered 504, its evaluations that
have not started are cancelled, and those already running finish (their slots free then).

`RemoteReward(url)` is the trainer's side: a TRL-compatible reward function that posts
each batch here and retries on 429/503.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor, wait
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kernelagent.rl.trl import PROBLEM_COLUMNS, KernelReward, _submit, evaluate_batch

log = logging.getLogger(__name__)

COLUMNS = ("completions",) + PROBLEM_COLUMNS + ("problem_id",)
MAX_BODY = 64 * 1024 * 1024


class Busy(Exception):
    pass


class RewardService:
    def __init__(self, reward: KernelReward, *, max_pending: int = 256,
                 request_timeout: float = 900.0, max_body: int = MAX_BODY) -> None:
        self.reward = reward
        self.max_pending = max_pending
        self.request_timeout = request_timeout
        self.max_body = max_body
        self.pending = 0
        self.served = 0
        self.rejected = 0
        self.timeouts = 0
        self.started = time.time()
        self._lock = threading.Lock()
        self._batch_runner = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kernelagent-batch")
        self.httpd: ThreadingHTTPServer | None = None

    # -- admission ---------------------------------------------------------------------
    def _admit(self, n: int) -> None:
        with self._lock:
            if self.pending + n > self.max_pending:
                self.rejected += 1
                raise Busy(f"{self.pending} completions pending, capacity {self.max_pending}")
            self.pending += n

    def _release(self, n: int) -> None:
        with self._lock:
            self.pending -= n

    def health(self) -> dict[str, Any]:
        backend = self.reward._backend
        return {"status": "ok", "pending": self.pending, "capacity": self.max_pending,
                "served": self.served, "rejected_busy": self.rejected, "timeouts": self.timeouts,
                "devices": list(getattr(backend, "devices", []) or []),
                "backend": type(backend).__name__ if backend is not None else "not started",
                "reward_config": self.reward.config.to_dict(),
                "uptime_s": round(time.time() - self.started, 1)}

    # -- scoring -----------------------------------------------------------------------
    def score(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        columns = to_columns(body)
        completions = columns.pop("completions")
        n = len(completions)
        if n == 0:
            return 200, {"rewards": [], "details": [], "seconds": 0.0}
        if n > self.max_pending:
            return 413, {"error": f"batch of {n} exceeds the service's capacity ({self.max_pending})"}
        timeout = self.request_timeout
        if isinstance(body.get("timeout"), (int, float)) and body["timeout"] > 0:
            timeout = min(timeout, float(body["timeout"]))
        started = time.monotonic()
        prepared = self.reward._prepare(completions, columns)  # ValueError -> 400
        jobs = prepared["jobs"]
        self._admit(len(jobs))  # Busy -> 429
        backend = self.reward.backend
        batched = not (hasattr(backend, "submit") and not hasattr(backend, "evaluate_batch"))
        if not batched:
            futures: list[Future] = []
            for job in jobs:
                future = _submit(backend, job)
                future.add_done_callback(lambda _f: self._release(1))
                futures.append(future)
        else:  # a backend that takes whole batches (Ray)
            future = self._batch_runner.submit(evaluate_batch, backend, jobs)
            future.add_done_callback(lambda _f, k=len(jobs): self._release(k))
            futures = [future]
        done, not_done = wait(futures, timeout=timeout)
        if not_done:
            for f in not_done:
                f.cancel()
            with self._lock:
                self.timeouts += 1
            return 504, {"error": f"request timed out after {timeout:.0f} s "
                                  f"({len(done)}/{len(futures)} evaluations finished)"}
        if batched:
            results = futures[0].result()
        else:
            results = []
            for f in futures:
                try:
                    results.append(f.result())
                except Exception as exc:
                    results.append(exc)
        breakdowns = self.reward._finish(prepared, results)
        with self._lock:
            self.served += n
        return 200, {"rewards": [b.value for b in breakdowns],
                     "details": [b.to_dict() for b in breakdowns],
                     "seconds": round(time.monotonic() - started, 3)}

    # -- HTTP --------------------------------------------------------------------------
    def make_server(self, host: str = "127.0.0.1", port: int = 8000) -> ThreadingHTTPServer:
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:
                log.info("%s %s", self.address_string(), fmt % args)

            def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/health":
                    self._send(200, service.health())
                else:
                    self._send(404, {"error": "not found: GET /health, POST /reward"})

            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/reward":
                    self._send(404, {"error": "not found: GET /health, POST /reward"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > service.max_body:
                    self.close_connection = True
                    self._send(413, {"error": f"body over {service.max_body} bytes"})
                    return
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("the body must be a JSON object")
                    status, reply = service.score(body)
                except Busy as exc:
                    self._send(429, {"error": f"busy: {exc}"}, {"Retry-After": "1"})
                    return
                except (ValueError, TypeError, json.JSONDecodeError) as exc:
                    self._send(400, {"error": str(exc)})
                    return
                except Exception as exc:  # never leave a trainer hanging
                    log.exception("reward request failed")
                    self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
                    return
                self._send(status, reply)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        return self.httpd

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        self._batch_runner.shutdown(wait=False, cancel_futures=True)
        self.reward.close()


def to_columns(body: dict[str, Any]) -> dict[str, list]:
    """The request's batch as TRL-style columns."""
    if "items" in body:
        items = body["items"]
        if not isinstance(items, list):
            raise ValueError("`items` must be a list")
        columns: dict[str, list] = {"completions": []}
        names = [c for c in PROBLEM_COLUMNS + ("problem_id",) if any(c in it for it in items)]
        for name in names:
            columns[name] = []
        for item in items:
            if not isinstance(item, dict):
                raise ValueError("each item must be an object")
            columns["completions"].append(item.get("completion"))
            for name in names:
                columns[name].append(item.get(name))
        return columns
    if not isinstance(body.get("completions"), list):
        raise ValueError("send `completions` (a list) with problem columns, or `items`")
    return {k: body[k] for k in COLUMNS if k in body}


class RemoteReward:
    """A TRL reward function backed by a `kernelagent serve` endpoint."""

    __name__ = "kernel_reward_remote"

    def __init__(self, url: str, *, timeout: float = 1800.0, retries: int = 60,
                 backoff: float = 1.0) -> None:
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.last: list[dict] = []

    def __call__(self, prompts: Any = None, completions: Any = None, completion_ids: Any = None,
                 **kwargs: Any) -> list[float | None]:
        body = {"completions": list(completions or [])}
        for name in PROBLEM_COLUMNS + ("problem_id",):
            if kwargs.get(name) is not None:
                value = kwargs[name]
                body[name] = value if isinstance(value, str) else list(value)
        reply = self.post(body)
        self.last = reply.get("details", [])
        return reply["rewards"]

    def post(self, body: dict) -> dict:
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(f"{self.url}/reward", data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code in (429, 503) and attempt < self.retries:
                    wait_s = float(exc.headers.get("Retry-After") or self.backoff)
                    time.sleep(min(30.0, wait_s * (1 + attempt * 0.5)))
                    continue
                detail = exc.read().decode(errors="replace")[:500]
                raise RuntimeError(f"reward service answered {exc.code}: {detail}") from None
        raise RuntimeError("reward service stayed busy")

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/health", timeout=30) as response:
            return json.loads(response.read())

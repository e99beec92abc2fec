"""An HTTP reward service: trainers on other machines send batches, the harness pool scores them.

    kernelagent serve --gpus 0,1,2,3 --port 8000

    POST /reward   {"completions": [...], "problem_source": [...]}        (TRL's columns)
                   or {"items": [{"completion": ..., "problem_source": ...}, ...]}
                   -> 200 {"rewards": [float | null, ...], "details": [...], "seconds": s}
    GET  /health   -> 200 {"status": "ok", "pending": n, "capacity": m, ...}

Backpressure: at most `max_pending` completions are admitted at once (queued or being
evaluated); a batch that would go past it is answered 429 with Retry-After, and one larger
than the whole capacity 413. A service shutting down answers 503, with Retry-After too.
Bodies: one over `max_body` bytes is answered 413 before the client sends it when the
client asks first (`Expect: 100-continue`), and otherwise after reading (and dropping) it,
so the client reads the 413 instead of a broken pipe; a body that stops short of its
Content-Length is given `read_timeout` seconds, then answered 408, and the thread is freed. Each request has a deadline (`request_timeout`, or the
request's own smaller "timeout"): past it the request is answered 504, its evaluations that
have not started are cancelled, and those already running finish (their slots free then).

`RemoteReward(url)` is the trainer's side: a TRL-compatible reward function that posts
each batch here. Connection errors (a service restarting), 429 and 5xx answers are retried
with exponential backoff (tenacity; Retry-After is honoured), `as_async()` gives the
`async def` form, and the batch's statistics go to TRL's `log_metric` / `log_extra`.
"""

from __future__ import annotations

import hmac
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
                 request_timeout: float = 900.0, max_body: int = MAX_BODY,
                 read_timeout: float = 60.0, token: str | None = None) -> None:
        self.reward = reward
        # A bearer token every request must carry (None: none needed; bind to 127.0.0.1 then).
        self.token = token or None
        self.read_timeout = read_timeout
        self.closing = False
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
            # Socket reads (headers and body) give up after this: a client that sends less
            # than its Content-Length cannot hold a handler thread forever.
            timeout = service.read_timeout

            def handle_expect_100(self) -> bool:
                # A client that asks first learns of a body too large before sending it.
                if self._too_large():
                    self.close_connection = True
                    self._send(413, {"error": f"body over {service.max_body} bytes"})
                    return False
                return super().handle_expect_100()

            def _too_large(self) -> bool:
                try:
                    return int(self.headers.get("Content-Length") or 0) > service.max_body
                except ValueError:
                    return False

            def _drain(self, length: int) -> None:
                """Read and drop a body (so the client's write completes and it can read
                our answer); give up on a read timeout or after 4x the limit."""
                left = min(length, 4 * service.max_body)
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    left -= len(chunk)

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

            def _authorised(self) -> bool:
                if service.token is None:
                    return True
                given = self.headers.get("Authorization", "")
                if hmac.compare_digest(given.encode(), f"Bearer {service.token}".encode()):
                    return True
                self.close_connection = True
                self._send(401, {"error": "a bearer token is required (Authorization: Bearer <token>)"},
                           {"WWW-Authenticate": "Bearer"})
                return False

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path.rstrip("/") == "/health":
                    self._send(200, service.health())
                else:
                    self._send(404, {"error": "not found: GET /health, POST /reward"})

            def do_POST(self) -> None:
                if not self._authorised():
                    return
                if self.path.rstrip("/") != "/reward":
                    self._send(404, {"error": "not found: GET /health, POST /reward"})
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length < 0:
                        raise ValueError(length)
                except ValueError:
                    self.close_connection = True
                    self._send(400, {"error": "a bad Content-Length"})
                    return
                if length > service.max_body:
                    self.close_connection = True
                    try:
                        self._drain(length)
                    except OSError:
                        pass
                    self._send(413, {"error": f"body over {service.max_body} bytes"})
                    return
                try:
                    data = self.rfile.read(length) if length else b""
                except OSError:  # socket timeout: the client sent less than it announced
                    data = None
                if data is None or len(data) < length:
                    self.close_connection = True
                    self._send(408, {"error": f"the body stopped short of its Content-Length "
                                              f"({0 if data is None else len(data)}/{length} bytes "
                                              f"within {service.read_timeout:g} s)"})
                    return
                if service.closing:
                    self._send(503, {"error": "the service is shutting down"}, {"Retry-After": "5"})
                    return
                try:
                    body = json.loads(data or b"{}")
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
        self.closing = True
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


class ServiceError(RuntimeError):
    """The reward service answered with an error that retrying will not fix."""


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(headers: Any) -> float | None:
    try:
        value = float(headers.get("Retry-After")) if headers is not None else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and value >= 0 else None


class RemoteReward:
    """A TRL reward function backed by a `kernelagent serve` endpoint.

    Connection errors, timeouts, 429 and 5xx are retried with exponential backoff (from
    `backoff` seconds, doubling, capped at `max_backoff`, with jitter; a Retry-After header
    is the floor of the wait) until `retries` retries or `max_wait` seconds have passed;
    then the call raises. 4xx answers other than 429 raise at once (ServiceError)."""

    __name__ = "kernel_reward_remote"

    def __init__(self, url: str, *, timeout: float = 1800.0, retries: int = 60,
                 backoff: float = 1.0, max_backoff: float = 30.0,
                 max_wait: float | None = 3600.0, token: str | None = None) -> None:
        import os

        self.url = url.rstrip("/")
        # The service's bearer token: given, or $KERNELAGENT_SERVE_TOKEN.
        self.token = token or os.environ.get("KERNELAGENT_SERVE_TOKEN") or None
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.max_backoff, self.max_wait = max_backoff, max_wait
        self.last: list[dict] = []
        self.attempts = 0  # HTTP attempts of the latest call

    def __call__(self, prompts: Any = None, completions: Any = None, completion_ids: Any = None,
                 **kwargs: Any) -> list[float | None]:
        reply = self.post(self.body(completions, kwargs))
        return self._done(reply, kwargs)

    def as_async(self):
        """An `async def` reward function: the request runs in a thread, so the trainer's
        event loop is free while the service scores the batch."""
        import asyncio

        async def kernel_reward_remote_async(prompts: Any = None, completions: Any = None,
                                             completion_ids: Any = None, **kwargs: Any) -> list[float | None]:
            reply = await asyncio.to_thread(self.post, self.body(completions, kwargs))
            return self._done(reply, kwargs)

        kernel_reward_remote_async.reward = self  # type: ignore[attr-defined]
        return kernel_reward_remote_async

    @staticmethod
    def body(completions: Any, columns: dict) -> dict:
        body: dict[str, Any] = {"completions": list(completions or [])}
        for name in PROBLEM_COLUMNS + ("problem_id",):
            if columns.get(name) is not None:
                value = columns[name]
                body[name] = value if isinstance(value, str) else list(value)
        return body

    def _done(self, reply: dict, kwargs: dict) -> list[float | None]:
        self.last = reply.get("details", [])
        log_details(self.last, kwargs)
        return reply["rewards"]

    def post(self, body: dict) -> dict:
        from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay

        data = json.dumps(body).encode()
        stop = stop_after_attempt(self.retries + 1)
        if self.max_wait is not None:
            stop = stop | stop_after_delay(self.max_wait)
        self.attempts = 0
        try:
            for attempt in Retrying(stop=stop, wait=self._wait, reraise=False,
                                    retry=retry_if_exception_type(_Retryable),
                                    before_sleep=self._log_retry):
                with attempt:
                    return self._post_once(data)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise ServiceError(f"reward service at {self.url} unavailable after {self.attempts} "
                               f"attempts: {last}") from None
        raise AssertionError("unreachable")

    def _wait(self, state: Any) -> float:
        import random

        base = min(self.max_backoff, self.backoff * 2 ** max(0, state.attempt_number - 1))
        delay = base * (0.5 + random.random() / 2)
        exc = state.outcome.exception() if state.outcome else None
        floor = getattr(exc, "retry_after", None)
        return max(delay, min(floor, self.max_backoff)) if floor is not None else delay

    def _log_retry(self, state: Any) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("reward service: %s; retrying (attempt %d)", exc, state.attempt_number)

    def _post_once(self, data: bytes) -> dict:
        import http.client
        import socket

        self.attempts += 1
        request = urllib.request.Request(f"{self.url}/reward", data=data, method="POST",
                                         headers={"Content-Type": "application/json", **self._auth()})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code == 429 or exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}: {detail}", _retry_after(exc.headers)) from None
            raise ServiceError(f"reward service answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError,
                http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise _Retryable(f"{type(exc).__name__}: {reason}") from None
        except json.JSONDecodeError as exc:
            raise _Retryable(f"an unreadable answer: {exc}") from None

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def health(self) -> dict:
        request = urllib.request.Request(f"{self.url}/health", headers=self._auth())
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())


def log_details(details: list[dict], kwargs: dict) -> None:
    """Feed TRL's per-batch logging hooks (`log_metric`, `log_extra`) from reward details."""
    if not details:
        return
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    try:
        if callable(log_metric):
            n = len(details)
            for key in ("compiled", "correct", "infra_error"):
                log_metric(f"kernel/{key}", sum(bool(d.get(key)) for d in details) / n)
        if callable(log_extra):
            log_extra("kernel_status", [d.get("status") for d in details])
    except Exception as exc:  # logging must never cost a batch its rewards
        log.debug("TRL logging hooks failed: %s", exc)

"""An HTTP reward service: trainers on other machines send batches, the harness pool scores them.

    kernelagent serve --gpus 0,1,2,3 --port 8000

    POST /reward   {"completions": [...], "problem_source": [...]}        (TRL's columns)
                   or {"items": [{"completion": ..., "problem_source": ...}, ...]}
                   -> 200 {"rewards": [float | null, ...], "details": [...], "seconds": s}
    GET  /health   -> 200 {"status": "ok", "pending": n, "capacity": m, ...}

A Starlette app on uvicorn, behind the guard `kernelagent mcp --http` uses too
(kernelagent/serving: the bearer token, the body's size and read timeout, the connection limits;
their statuses are in serving/guard.py). Here: at most `max_pending` completions are admitted at
once (queued or being evaluated); a batch that would go past it is answered 429 with
Retry-After, and one larger than the whole capacity 413. Each request has a deadline
(`request_timeout`, or the request's own smaller "timeout"): past it the request is answered
504, its evaluations that have not started are cancelled, and those already running finish
(their slots free then). A client that disconnects while its batch is scored gets the same:
nothing of it stays queued. A service shutting down answers 503 with Retry-After, also to
requests in flight.

`RemoteReward(url)` is the trainer's side: a TRL-compatible reward function that posts
each batch here. Connection errors (a service restarting), 429 and 5xx answers are retried
with exponential backoff (tenacity; Retry-After is honoured), `as_async()` gives the
`async def` form, and the batch's statistics go to TRL's `log_metric` / `log_extra`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from kernelagent import settings
from kernelagent.rl.trl import PROBLEM_COLUMNS, KernelReward, evaluate_batch, submit_job
from kernelagent.serving.guard import Limits

log = logging.getLogger(__name__)

COLUMNS = ("completions",) + PROBLEM_COLUMNS + ("problem_id",)
MAX_BODY = Limits.max_body
ROUTES = "GET /health, POST /reward"

# What the service answers besides the shared stack's statuses (serving/guard.py STATUSES);
# docs/hooks.py renders both into the training guide.
STATUSES = {
    200: "scored: `rewards` and `details`, one per completion, in order",
    400: "a body that is not a JSON object, or columns that do not make a batch; JSON `{\"error\": ...}`",
    404: "a path other than /health and /reward",
    405: "a method the path does not take (GET /reward, POST /health); `Allow` names the one it does",
    413: "a batch larger than the whole capacity (`--max-pending`), besides a body over the size limit",
    429: "busy: the batch would take more than `--max-pending` completions in flight; `Retry-After: 1`",
    500: "an unexpected error in the service, with its type and message",
    503: "the service is shutting down (also to requests in flight); `Retry-After: 5`",
    504: "the request's deadline passed; its evaluations not yet started are cancelled",
}


class Busy(Exception):
    pass


class _Gone(Exception):
    """The client disconnected before its batch was scored."""


class RewardService:
    def __init__(self, reward: KernelReward, *, max_pending: int = 256,
                 request_timeout: float = 900.0, max_body: int = MAX_BODY,
                 read_timeout: float = 60.0, token: str | None = None,
                 max_connections: int | None = None) -> None:
        self.reward = reward
        # A bearer token every request must carry (None: none needed; bind to 127.0.0.1 then).
        self.token = token or None
        self.closing = False
        self.max_pending = max_pending
        self.request_timeout = request_timeout
        self.limits = Limits(max_body=max_body, read_timeout=read_timeout,
                             max_connections=max_connections or max(Limits.max_connections, max_pending + 64))
        self.pending = 0
        self.served = 0
        self.rejected = 0
        self.timeouts = 0
        self.disconnects = 0
        self.started = time.time()
        self._lock = threading.Lock()
        self._batch_runner = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kernelagent-batch")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed: asyncio.Event | None = None
        self.server: Any = None  # serving.server.Server, once make_server made it

    @property
    def max_body(self) -> int:
        return self.limits.max_body

    @property
    def read_timeout(self) -> float:
        return self.limits.read_timeout

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
        backend = self.reward.started_backend
        return {"status": "ok", "pending": self.pending, "capacity": self.max_pending,
                "served": self.served, "rejected_busy": self.rejected, "timeouts": self.timeouts,
                "disconnects": self.disconnects,
                "connections": self.server.connections if self.server is not None else 0,
                "devices": list(getattr(backend, "devices", []) or []),
                "backend": type(backend).__name__ if backend is not None else "not started",
                "reward_config": self.reward.config.to_dict(),
                "uptime_s": round(time.time() - self.started, 1)}

    # -- scoring -----------------------------------------------------------------------
    def score(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, reply) for a request's body, outside any server."""
        return asyncio.run(self.ascore(body))

    async def ascore(self, body: dict[str, Any],
                     gone: Callable[[], Awaitable[Any]] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, reply) for a request's body; `gone()` returns when the client has left (then
        _Gone is raised, the batch's evaluations not yet started cancelled)."""
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
        # ValueError -> 400; parsing problems and finding candidates runs off the event loop
        prepared, backend = await asyncio.to_thread(lambda: (self.reward.prepare(completions, columns),
                                                             self.reward.backend))
        jobs = prepared["jobs"]
        self._admit(len(jobs))  # Busy -> 429
        batched = not (hasattr(backend, "submit") and not hasattr(backend, "evaluate_batch"))
        if not batched:
            futures: list[Future] = []
            for job in jobs:
                future = submit_job(backend, job)
                future.add_done_callback(lambda _f: self._release(1))
                futures.append(future)
        else:  # a backend that takes whole batches (Ray)
            try:
                future = self._batch_runner.submit(evaluate_batch, backend, jobs)
            except RuntimeError:  # the service is closing: nothing was admitted after all
                self._release(len(jobs))
                return 503, {"error": "the service is shutting down"}
            future.add_done_callback(lambda _f, k=len(jobs): self._release(k))
            futures = [future]
        outcome, results = await self._wait(futures, timeout, gone)
        if outcome == "timeout":
            with self._lock:
                self.timeouts += 1
            finished = sum(f.done() and not f.cancelled() for f in futures)
            return 504, {"error": f"request timed out after {timeout:.0f} s "
                                  f"({finished}/{len(futures)} evaluations finished)"}
        if outcome == "closing":
            return 503, {"error": "the service is shutting down"}
        if outcome == "gone":
            with self._lock:
                self.disconnects += 1
            raise _Gone()
        if batched:
            if isinstance(results[0], BaseException):
                raise results[0]
            results = results[0]
        breakdowns = await asyncio.to_thread(self.reward.rewards, prepared, list(results))
        with self._lock:
            self.served += n
        return 200, {"rewards": [b.value for b in breakdowns],
                     "details": [b.to_dict() for b in breakdowns],
                     "seconds": round(time.monotonic() - started, 3)}

    async def _wait(self, futures: list[Future], timeout: float,
                    gone: Callable[[], Awaitable[Any]] | None) -> tuple[str, list]:
        """("done", results) or (the first of "timeout", "closing", "gone", []); in the latter
        the evaluations not yet started are cancelled (those running finish, then free their slots)."""
        finished = asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        closed = asyncio.ensure_future(self._closed_event().wait())
        left = asyncio.ensure_future(gone()) if gone is not None else None
        watchers = [w for w in (closed, left) if w is not None]
        try:
            done, _ = await asyncio.wait([finished, *watchers], timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watcher in watchers:
                watcher.cancel()
        if finished in done:
            return "done", finished.result()
        for future in futures:
            future.cancel()
        finished.cancel()  # and its wrappers: a job still running, once done, is not set on a closed loop
        finished.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
        return ("timeout" if not done else "closing" if closed in done else "gone"), []

    def _closed_event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._closed is None or self._loop is not loop:  # one per loop (score() runs its own)
            self._loop = loop
            self._closed = asyncio.Event()
            if self.closing:
                self._closed.set()
        return self._closed

    def stop_accepting(self) -> None:
        """Answer 503 + Retry-After from now on, requests in flight too (their evaluations not yet
        started are cancelled): trainers send them again once the service is back."""
        self.closing = True
        loop, event = self._loop, self._closed
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has ended
                pass

    # -- HTTP --------------------------------------------------------------------------
    def app(self) -> Any:
        """The ASGI app: Starlette's routes behind the shared guard (kernelagent.serving)."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        from kernelagent.serving.guard import guard

        async def http_error(_request: Any, exc: HTTPException) -> Any:
            return _json(exc.status_code, {"error": f"{str(exc.detail).lower()}: {ROUTES}"}, exc.headers)

        routes = [Route(path, self._get_health, methods=["GET"]) for path in ("/health", "/health/")]
        routes += [Route(path, self._post_reward, methods=["POST"]) for path in ("/reward", "/reward/")]
        return guard(Starlette(routes=routes, exception_handlers={HTTPException: http_error}),
                     self.limits, self.token)

    async def _get_health(self, _request: Any) -> Any:
        return _json(200, self.health())

    async def _post_reward(self, request: Any) -> Any:
        self._closed_event()
        if self.closing:
            return _json(503, {"error": "the service is shutting down"}, {"Retry-After": "5"})
        data = await request.body()  # whole, within the limits: the guard read it

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        try:
            body = json.loads(data or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            status, reply = await self.ascore(body, gone)
        except Busy as exc:
            return _json(429, {"error": f"busy: {exc}"}, {"Retry-After": "1"})
        except _Gone:
            return _json(503, {"error": "the client disconnected"})  # never sent: no one is there
        except (ValueError, TypeError) as exc:
            return _json(400, {"error": str(exc)})
        except Exception as exc:  # never leave a trainer hanging
            log.exception("reward request failed")
            return _json(500, {"error": f"{type(exc).__name__}: {exc}"})
        return _json(status, reply, {"Retry-After": "5"} if status == 503 else None)

    def make_server(self, host: str = "127.0.0.1", port: int = 8000) -> Any:
        """A serving.server.Server (uvicorn) for this service, its socket bound; run it with
        `serve_forever()` (in a thread: `start()`), or `serve_until_signal()`."""
        from kernelagent.serving import require
        from kernelagent.serving.server import Server

        require("kernelagent serve", "rl")
        self.server = Server(self.app(), host, port, self.limits)
        return self.server

    def close(self) -> None:
        self.stop_accepting()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        self._batch_runner.shutdown(wait=False, cancel_futures=True)
        self.reward.close()


def _json(status: int, body: dict, headers: Any = None) -> Any:
    from starlette.responses import Response

    return Response(json.dumps(body), status_code=status, headers=dict(headers or {}),
                    media_type="application/json")


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
        self.token = token or settings.get("KERNELAGENT_SERVE_TOKEN") or None
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

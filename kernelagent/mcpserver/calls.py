"""One tool call's run: admitted against its session's budget, cancelled alone.

- The shared harness (`Harness`: one Evaluator for the whole server, every session's jobs
  sharing its device gate) is never killed for one call: a call that is cancelled by its client,
  or that runs out of its session's seconds, sets its own cancel event, and the Evaluator kills
  that call's jobs alone (harness protocol `cancel`: server/main.py Dispatcher.cancel).
- A call is admitted with a lease on its session's budget (session.py) before it starts;
  progress goes to the client every PROGRESS_EVERY_S; at the end of its lease it asks for more,
  and with none left its job is cancelled and the call ends with a tool error.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver.exceptions import ToolError  # this module is imported only by `kernelagent mcp`

from kernelagent.mcpserver.session import Sessions, ToolInputError

if TYPE_CHECKING:
    from kernelagent.problem import Problem
    from pathlib import Path
    from kernelagent.harness import EvalConfig, EvalResult, EvaluatorProtocol

PROGRESS_EVERY_S = 2.0
CANCEL_GRACE_S = 35.0  # how long a call stopped for its budget waits for its job to end


class Harness:
    """The server's one Evaluator (started on first use; started again if its server died) and
    the threads tool calls run in."""

    def __init__(self, device: str, isolation: str = "auto", cache_dir: str | None = None, *,
                 daemon: bool | None = None) -> None:
        # daemon: this user's warm harness (harness/caller/daemon.py), as Evaluator(daemon=) takes
        # it; `kernelagent mcp` resolves --daemon/--no-daemon (on by default) to a bool.
        self.device, self.isolation, self.cache_dir, self.daemon = device, isolation, cache_dir, daemon
        self.lock = threading.Lock()
        self._evaluator: Any = None
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="mcp-call")
        self.confinement: Any = None  # confined.Confinement: problem code the server runs itself

    def evaluator(self) -> Any:
        """The shared Evaluator, started; a harness that cannot start is the call's tool error."""
        from kernelagent.harness import Evaluator, HarnessStartError

        with self.lock:
            if self._evaluator is None:
                kwargs = {"device": self.device, "isolation": self.isolation, "daemon": self.daemon}
                if self.cache_dir:
                    kwargs["cache_dir"] = self.cache_dir
                evaluator = Evaluator(**kwargs)
                try:
                    evaluator.start()
                except HarnessStartError as exc:
                    evaluator.close()
                    raise ToolInputError("the evaluation harness could not start: "
                                         + (str(exc).strip().splitlines() or ["no reason given"])[0]) from None
                self._evaluator = evaluator
            return self._evaluator

    def close(self) -> None:
        with self.lock:
            evaluator, self._evaluator = self._evaluator, None
        if evaluator is not None:
            evaluator.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.confinement is not None:
            self.confinement.close()


class CallEvaluator:
    """The shared Evaluator as one call sees it: each evaluation it starts is cancelled with the
    call (`cancel`), and the last result is kept (a bad problem's verdict)."""

    def __init__(self, evaluator: EvaluatorProtocol, cancel: threading.Event) -> None:
        self._evaluator, self._cancel = evaluator, cancel
        self.last: Any = None

    def evaluate(self, problem: Problem | str | Path, candidate_source: str, config: EvalConfig | None = None, *,
                 cancel: threading.Event | None = None) -> EvalResult:
        """EvaluatorProtocol: cancelled with the call, and with `cancel` too where one is given."""
        if cancel is None or cancel is self._cancel:
            self.last = self._evaluator.evaluate(problem, candidate_source, config, cancel=self._cancel)
            return self.last
        either, done = threading.Event(), threading.Event()

        def watch() -> None:  # either event cancels the evaluation
            while not done.wait(0.05):
                if cancel.is_set() or self._cancel.is_set():
                    either.set()
                    return

        threading.Thread(target=watch, name="kernelagent-cancel", daemon=True).start()
        try:
            self.last = self._evaluator.evaluate(problem, candidate_source, config, cancel=either)
        finally:
            done.set()
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self._evaluator, name)


def guard(fn: Any) -> Any:
    """fn(), with a bad argument turned into the tool's error (its message, never a traceback)."""
    try:
        return fn()
    except ToolInputError as exc:
        raise ToolError(str(exc)) from None


def session_key(ctx: Any) -> str:
    """One budget per client session: the transport's session id (HTTP's Mcp-Session-Id, which the
    server issued); a stdio server has one client, its process's."""
    try:
        session_id = ctx.request_context.session_id
    except Exception:  # noqa: BLE001 - an SDK without it: the header the transport checked
        session_id = None
    if not session_id:
        try:
            headers = ctx.headers or {}
        except Exception:  # noqa: BLE001 - no transport headers (stdio)
            headers = {}
        session_id = headers.get("mcp-session-id") or headers.get("Mcp-Session-Id")
    return f"http:{session_id}" if session_id else "stdio"


async def run_call(ctx: Any, sessions: Sessions, harness: Harness, what: str, fn: Any) -> Any:
    """fn(cancel) in a thread, admitted against the session's budget; progress while it runs. A
    cancelled request, or a lease that cannot be extended, sets `cancel`: the call's own jobs
    die, the shared harness and every other call go on."""
    budget = sessions.budget(session_key(ctx))
    lease = guard(budget.admit)
    cancel = threading.Event()
    loop = asyncio.get_running_loop()
    try:
        task = loop.run_in_executor(harness.pool, fn, cancel)
    except BaseException:
        lease.settle()
        raise
    try:
        while True:
            wait = max(0.05, min(PROGRESS_EVERY_S, lease.deadline - time.monotonic()))
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                return task.result()
            if time.monotonic() >= lease.deadline and not lease.extend():
                cancel.set()  # the session's seconds are spent: this call's job goes, nothing else
                await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
                snapshot = budget.snapshot()
                raise ToolError(f"{what} was stopped: this session's evaluation time ran out while it ran "
                                f"({budget.max_seconds:.0f} s in all, {snapshot['in_flight']} call(s) in flight); "
                                "its job was cancelled. Start a new session or raise --max-gpu-seconds")
            elapsed = time.monotonic() - lease.started
            try:
                await ctx.report_progress(elapsed, None, f"{what}: {elapsed:.0f} s")
            except Exception:  # noqa: BLE001 - a client without progress support
                pass
    except asyncio.CancelledError:
        cancel.set()  # the client cancelled: this call's job is killed, the harness stays up
        raise
    except ToolInputError as exc:
        raise ToolError(str(exc)) from None
    finally:
        lease.settle()

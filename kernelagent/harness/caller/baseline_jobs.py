"""A problem's baselines off its candidates' path (caller/evaluator.py `Evaluator.evaluate`).

An evaluation that misses the baseline cache takes the problem's claim (BaselineCache.claim)
without waiting. Holding it, on a server that runs several jobs at once, it starts a job of the
baselines' own at once (protocol `evaluate_baselines`: the reference's process only, server/job.py
run_baselines_only) beside its candidate's job, which runs without them; the entry is stored and
the claim let go as soon as that job answers, and the candidate's result waits for it only at its
end. It depends on no candidate: an incorrect first candidate still leaves the entry. A server
that runs one job at a time would queue the two jobs one behind the other: there the candidate's
job times them after its verdict, as before (`in_job`). An evaluation that did not get the claim
runs without baselines and waits for the entry after its own verdict; finding none (the holder's
job failed, or it was killed), it holds the claim then and starts the baselines' job itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from kernelagent.harness.caller.baseline_cache import BaselineCache
from kernelagent.harness.caller.results import store_baselines
from kernelagent.harness.config import EvalConfig
from kernelagent.harness.result import Status


class RoundTrips(Protocol):
    """What a baselines' job uses of the evaluator (caller/channel.py ServerChannel)."""

    def _round_trip(self, request: dict[str, Any], deadline_s: float, cancel: threading.Event | None = None,
                    on_baselines: Callable[[dict[str, Any]], None] | None = None,
                    kind: str = "evaluate") -> dict[str, Any] | None: ...


def wanted(config: EvalConfig, fingerprint: dict[str, Any]) -> bool:
    """Are this evaluation's baselines timed at all (a compile-only CUDA candidate without a GPU: no)?"""
    cuda_without_gpu = config.backend == "cuda" and not fingerprint.get("cuda")
    return bool(config.timing and config.baselines and not config.compile_only and not cuda_without_gpu)


def _numbers(fields: object, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    """The entries of a server's dict that are numbers (all, or those of `keys`), as floats."""
    if not isinstance(fields, dict):
        return {}
    return {k: float(v) for k, v in fields.items()
            if (keys is None or k in keys) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _read(reply: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the baselines, the job's result) from a baselines' job's reply; a failure of any kind in
    the baselines' `errors`, never a verdict about a candidate."""
    if reply is None:
        return {"errors": {"harness": "the baselines' job did not answer within its deadline"}}, {}
    if reply.get("cancelled"):
        return {"errors": {"harness": "the baselines' job was cancelled"}}, {}
    if "error" in reply:
        return {"errors": {"harness": str(reply["error"])[:2000]}}, {}
    result = reply.get("result") if isinstance(reply.get("result"), dict) else {}
    baselines = result.get("baselines")
    if not isinstance(baselines, dict) or not isinstance(baselines.get("errors", {}), dict) \
            or not isinstance(baselines.get("timings", {}), dict):
        return {"errors": {"harness": "the baselines' job sent no baselines"}}, result
    return baselines, result


class BaselinesJob:
    """One problem's baselines, timed by a job of their own in a thread of this caller; the claim
    it was given is let go once the entry is stored (or the job failed)."""

    def __init__(self, *, channel: RoundTrips, request: dict[str, Any], deadline_s: float,
                 store: Callable[[dict[str, Any]], bool], claim: contextlib.ExitStack, cancel: threading.Event | None = None):
        self._channel, self._request, self._deadline_s, self._cancel = channel, request, deadline_s, cancel
        self._store, self._claim, self._lock = store, claim, threading.Lock()
        self.baselines: dict[str, Any] = {}
        self.result: dict[str, Any] = {}
        self.sent = time.time()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kernelagent-baselines", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            reply = self._channel._round_trip(self._request, self._deadline_s, self._cancel,
                                              kind="evaluate_baselines")
            if reply is not None and "result" in reply and \
                    (reply["result"].get("concurrency") or {}).get("retry_alone"):
                # Timed while the device's memory was full beside others: timed again alone.
                alone = dict(self._request, options=dict(self._request["options"], alone=True))
                reply = self._channel._round_trip(alone, self._deadline_s, self._cancel, kind="evaluate_baselines")
            self.baselines, self.result = _read(reply)
            self._store(self.baselines)
        except Exception:  # noqa: BLE001 - a bug of ours: the candidate's result goes on without them
            self.baselines = {"errors": {"harness": traceback.format_exc(limit=3)}}
        finally:
            self.release()
            self._done.set()

    def release(self) -> None:
        with self._lock:
            self._claim.close()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(max(0.0, timeout_s))

    def stage_seconds(self) -> dict[str, float]:
        """The job's stage clocks, as the server sent them (numbers only)."""
        return _numbers(self.result.get("stage_seconds"))

    def describe(self) -> dict[str, Any]:
        """For the holder's result (concurrency["baselines_job"]): the job's span on the server,
        its stage clocks, and its waits for the timing slot and for admission (numbers only)."""
        concurrency = self.result.get("concurrency") if isinstance(self.result.get("concurrency"), dict) else {}
        return {"sent": round(self.sent, 4), "span": concurrency.get("span"),
                "retried_alone": bool(concurrency.get("retry_alone")), "stage_seconds": self.stage_seconds(),
                "slot": _numbers(concurrency, ("wait_s", "held_s", "admission_wait_s"))}


class ProblemBaselines:
    """This evaluation's part in its problem's baselines (the module's docstring)."""

    def __init__(self, *, channel: RoundTrips, cache: BaselineCache, key: str, config: EvalConfig,
                 fingerprint: dict[str, Any], problem_sha256: str, problem_source: str, options: dict[str, Any],
                 deadline_s: float, coordinate: bool, jobs_at_once: int, cancel: threading.Event | None = None):
        self.channel, self.cache, self.key, self.config = channel, cache, key, config
        self.fingerprint, self.problem_sha256, self.deadline_s = fingerprint, problem_sha256, deadline_s
        self.request = {"config": config.to_dict(), "problem_source": problem_source, "options": dict(options)}
        self.coordinate, self.jobs_at_once, self.cancel = coordinate, jobs_at_once, cancel
        self.claims = contextlib.ExitStack()
        self.job: BaselinesJob | None = None
        self.in_job = False  # the candidate's job times them after its verdict (one job at a time)
        self.deferred = False  # another evaluation holds the claim: its entry, after this verdict

    def store(self, baselines: dict[str, Any]) -> bool:
        return store_baselines(self.cache, self.key, baselines, self.fingerprint, self.problem_sha256, self.config)

    def begin(self, cached: dict[str, Any] | None) -> dict[str, Any] | None:
        """Before the candidate's job is sent: the entry where one is there now, else the claim
        taken without waiting and the baselines' job started (or `in_job`, or `deferred`)."""
        if cached is not None or not wanted(self.config, self.fingerprint):
            return cached
        claim = contextlib.ExitStack()
        if self.config.use_baseline_cache and self.coordinate:
            if not claim.enter_context(self.cache.claim(self.key, wait_s=0)):
                self.deferred = True
                return None
            cached = self.cache.get(self.key)  # written while we looked
            if cached is not None:
                claim.close()
                return cached
        self._start(claim)
        return None

    def _start(self, claim: contextlib.ExitStack) -> None:
        if self.jobs_at_once <= 1:
            self.in_job = True
            self.claims.enter_context(claim)  # let go by `early`, or when the evaluation ends
            return
        self._send_job(claim)

    def _send_job(self, claim: contextlib.ExitStack) -> None:
        """The baselines' job, let go of `claim` once it has stored the entry (or failed)."""
        self.job = BaselinesJob(channel=self.channel, request=self.request, deadline_s=self.deadline_s,
                                store=self.store, claim=claim, cancel=self.cancel)

    def early(self, baselines: dict[str, Any]) -> None:
        """`in_job`: the candidate's job sent the baselines before its evidence stage: stored, and
        their claim let go, so an evaluation of this problem waiting for them goes on now."""
        if self.in_job and self.store(baselines):
            self.claims.close()

    def finish(self, raw: dict[str, Any], stage_seconds: dict[str, float]) -> dict[str, Any] | None:
        """After the candidate's verdict (`raw`, the server's result): the cache's entry to merge,
        or None with the fresh baselines put in `raw` (merged as the server's own)."""
        if raw.get("status") != Status.CORRECT:
            return None
        waited = time.monotonic()
        if self.deferred:
            held = self.claims.enter_context(self.cache.claim(self.key, wait_s=self.deadline_s))
            cached = self.cache.get(self.key)
            if cached is not None or not held:  # not held: the holder hangs; no baselines then
                stage_seconds["baseline_wait"] = time.monotonic() - waited
                return cached
            # The holder's job left no entry (it failed, or its evaluator was killed): ours now,
            # a baselines' job (never the candidate's job again), the claim held till the end.
            self.deferred = False
            self._send_job(contextlib.ExitStack())
        if self.job is not None:
            self.job.wait(self.deadline_s)
            stage_seconds["baseline_wait"] = time.monotonic() - waited
            raw["baselines"] = self.job.baselines
            raw["flags"] = list(raw.get("flags") or []) + [f for f in self.job.result.get("flags") or []
                                                           if isinstance(f, dict)]
            raw.setdefault("concurrency", {})["baselines_job"] = self.job.describe()
            job_seconds = self.job.stage_seconds()
            for key in ("baselines", "baselines_compile"):
                if key in job_seconds:
                    # what compiling and timing them took, beside this candidate's job (the result's
                    # own clocks); baselines_compile: until the reference had compiled every runner
                    raw.setdefault("stage_seconds", {})[key] = job_seconds[key]
        return None

    def release(self) -> None:
        """When the evaluation ends: the claims it holds itself let go. A baselines' job still
        running (an incorrect candidate does not wait for it) keeps its own until it has stored
        the entry or failed, so that no other evaluation starts the same job meanwhile."""
        self.claims.close()

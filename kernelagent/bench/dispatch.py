"""Every evaluation of a bench run goes through the `Dispatcher`: the store first (a content
hash of problem, candidate, settings and environment), and only a miss reaches a harness server,
its jobs overlapped per GPU. `ProblemEvaluator` is the Evaluator-shaped face of it that the agent
uses; `summarise` is the compact record of one evaluation the store keeps."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kernelagent.bench.store import Store, evaluation_key
from kernelagent.errors import UserError

if TYPE_CHECKING:
    from kernelagent.bench.progress import BenchProgress
    from pathlib import Path
    from kernelagent.problem import Problem
    from kernelagent.harness import EvalConfig, EvalResult


def summarise(result: dict) -> dict[str, Any]:
    """What an attempt keeps of an EvalResult dict (the full result stays in `evaluations`)."""
    from kernelagent.bench.store import result_passed

    timings = result.get("timings") or {}
    meaningful = bool(timings) and all(t.get("meaningful", True) for t in timings.values())
    speedups = result.get("speedups") or {}
    intervals = result.get("speedup_intervals") or {}
    passed = result_passed(result)
    return {
        "status": result.get("status"),
        "passed": passed,
        "compiled": bool(result.get("compiled")),
        "timings_meaningful": meaningful,
        "speedup_eager": speedups.get("eager") if meaningful and passed else None,
        "speedup_inductor": speedups.get("compile") if meaningful and passed else None,
        # The 95% intervals (fast_p decides on their low end: metrics.py).
        "interval_eager": intervals.get("eager") if meaningful and passed else None,
        "interval_inductor": intervals.get("compile") if meaningful and passed else None,
        "raw_speedups": speedups,
        "raw_intervals": intervals,
        "flags": [f"{f.get('severity')}:{f.get('kind')}" for f in result.get("flags") or []
                  if f.get("severity") in ("review", "reject")],
        "reason": (result.get("reason") or "").strip().splitlines()[0][:300] if result.get("reason") else "",
        "seconds": (result.get("stage_seconds") or {}).get("total"),
        "device": result.get("device"),
    }



def harness_text(harness: object) -> str:
    """Dispatcher.harness() in words ('' for a run recorded before it was kept)."""
    if not isinstance(harness, dict) or not isinstance(harness.get("devices"), list):
        return ""
    devices = [d for d in harness["devices"] if isinstance(d, dict)]
    warm = [d for d in devices if d.get("warm")]
    if warm and len(warm) == len(devices):
        started = sum(1 for d in warm if d.get("started_now"))
        return ("this user's warm harness per device"
                + (f" ({started} of {len(warm)} started by this session)" if started else " (found warm)"))
    why = sorted({str(d["why"]) for d in devices if isinstance(d.get("why"), str)})
    own = "servers of the run's own" + (f" (warm harness {'; '.join(why)})" if why else "")
    if not warm:
        return own
    return (f"this user's warm harness on {', '.join(str(d.get('device')) for d in warm)}, "
            f"{own} on the others")


@runtime_checkable
class DispatchWorker(Protocol):
    """What a Dispatcher's job thread calls: a local harness Evaluator (an EvalResult) or a Ray
    worker (ray_pool.RayWorker: the plain dict its actor sent, or WorkerLost). A seam of its own,
    not EvaluatorProtocol: a remote worker answers data that is checked here, and its loss is
    told apart from a verdict."""

    def evaluate(self, problem: Problem, source: str, config: EvalConfig) -> EvalResult | dict[str, Any]: ...


@runtime_checkable
class AnsweringWorker(Protocol):
    """A DispatchWorker that says when its server has answered for the candidate's job, before
    the result waits for the problem's baselines (harness Evaluator.evaluate_answering): its
    device's room goes to the next evaluation then (Dispatcher)."""

    def evaluate_answering(self, problem: Problem, candidate_source: str, config: EvalConfig | None = None, *,
                           cancel: Any = None, on_answered: Callable[[], None] | None = None) -> EvalResult: ...


@runtime_checkable
class StoreDispatch(Protocol):
    """Dispatcher.evaluate: one attempt of a bench run, through the store (a verdict stored for
    the same key is reused). A seam of its own, not EvaluatorProtocol: it records the attempt
    under its problem key and sample name and answers (result dict, evaluation key, reused).
    ProblemEvaluator turns it into an EvaluatorProtocol for the agent."""

    def evaluate(self, problem: Problem, source: str, config: EvalConfig, *, problem_key: str,
                 sample: str) -> tuple[dict, str | None, bool]: ...


class WorkerLost(Exception):
    """Raised by a remote worker's `evaluate` when the worker went away mid-evaluation (a Ray
    node or actor lost): the evaluation did not finish there and is sent to another worker."""


class Dispatcher:
    """Store first, then a harness server per device. Each device has as many evaluations in its
    server at once as the server runs jobs at once (its `concurrency`, chosen by the server from
    the host's CPUs and the device's memory, or `--jobs-per-gpu`): a long-lived job thread takes
    the next job from one shared queue whenever the device has room (a permit of the device's
    `slots`). The server overlaps those jobs' host work and gives each timed phase the device
    alone (harness/server/gate.py), so timings never overlap.

    An evaluation whose server job has answered but whose result still waits for its problem's
    baselines (the fill: caller/baseline_jobs.py) gives its permit back (`on_answered`), and
    another thread of the device takes the next job: each device has twice its slots in threads.
    Holding the permit, a one-GPU bench's first wave left the server idle but for the baselines
    while its threads waited for them (session 36, one H200: the second wave's first job started
    7.75 s after the first of the wave's jobs had answered).

    The servers are started, and restarted after a crash, only from these device threads: a
    server sandboxed by bubblewrap's --die-with-parent dies with the *thread* that started it
    (PR_SET_PDEATHSIG), so it must not be started from a short-lived worker thread.

    With `bench --ray` the evaluators are Ray workers (ray_pool.RayWorker): they answer plain
    dicts, and one that is lost raises WorkerLost; its job goes back to the queue (for a worker
    that is alive) and is recorded only when some worker finishes it, so nothing is counted
    twice. A worker that cannot be replaced ends its thread; when none is left, what is still
    queued fails with one UserError.
    """

    def __init__(self, pool: Any, store: Store, run_id: str, progress: BenchProgress):
        from concurrent.futures import Future

        self.pool, self.store, self.run_id, self.progress = pool, store, run_id, progress
        self.labels = _labels(pool.devices)
        self._jobs: queue.Queue = queue.Queue()
        self._inflight: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.performed = 0
        self.reused = 0
        self.resubmitted = 0  # evaluations sent again after their worker was lost
        self.store_seconds = 0.0  # spent in store lookups and records (summed over threads)
        self._alive = len(pool.evaluators)  # job threads alive (a device's first, then its others)
        self._closing = False
        self.slots = [1] * len(pool.evaluators)  # jobs at once per device, as its server admits them
        self.threads = [1] * len(pool.evaluators)  # job threads per device (twice its slots)
        self._permits = [threading.Semaphore(1) for _ in pool.evaluators]  # its slots, held per evaluation
        self._gone = [False] * len(pool.evaluators)  # a device whose worker was lost for good
        self.concurrency = [{} for _ in pool.evaluators]  # each server's {"jobs", "default", "why"}
        started: list[Future] = [Future() for _ in pool.evaluators]
        self._threads = [threading.Thread(target=self._device_loop, args=(i, ev, started[i]), daemon=True,
                                          name=f"bench-device-{i}") for i, ev in enumerate(pool.evaluators)]
        for thread in self._threads:
            thread.start()
        try:  # every server starts at once, each in its own device thread
            self.fingerprints = [f.result() for f in started]
        except BaseException:
            self.close()
            raise

    @property
    def parallel(self) -> int:
        """Evaluations in the servers at once over every device."""
        return sum(self.slots)

    @property
    def queue_depth(self) -> int:
        """Evaluations a caller keeps queued at once for the devices to take (their job threads)."""
        return sum(self.threads)

    def describe(self) -> str:
        """'4 jobs at once per device (min(16 CPUs / 2, 70 GiB free / 4 GiB, 8))', for the
        progress line: the default is printed, not hidden."""
        shown = sorted({(c.get("jobs") or 1, c.get("why") or "") for c in self.concurrency})
        return "; ".join(f"{jobs} job{'s' if jobs != 1 else ''} at once per device" + (f" ({why})" if why else "")
                         for jobs, why in shown)

    def _device_loop(self, index: int, evaluator: DispatchWorker, started: Any) -> None:
        try:
            fingerprint = evaluator.fingerprint()
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            started.set_exception(exc)
            return
        concurrency = dict(fingerprint.get("concurrency") or {})
        slots = max(1, int(concurrency.get("jobs") or 1))
        self.concurrency[index], self.slots[index] = concurrency, slots
        self._permits[index] = threading.Semaphore(slots)
        self.threads[index] = 2 * slots
        # The device's other job threads start here and end before this one closes the server:
        # a server sandboxed with --die-with-parent dies with the thread that started it, and
        # every one of these threads lives until close().
        helpers = [threading.Thread(target=self._job_loop, args=(index, evaluator, slot), daemon=True,
                                    name=f"bench-device-{index}-job-{slot}") for slot in range(1, 2 * slots)]
        with self._lock:
            self._alive += len(helpers)
        for thread in helpers:
            thread.start()
        started.set_result(fingerprint)
        try:
            self._job_loop(index, evaluator, 0)
        finally:
            for thread in helpers:
                thread.join()
            evaluator.close()  # from the thread that started it

    def _job_loop(self, index: int, evaluator: DispatchWorker, slot: int) -> None:
        label = self.labels[index] if slot == 0 else f"{self.labels[index]}/{slot + 1}"
        permits = self._permits[index]
        answering = evaluator.evaluate_answering if isinstance(evaluator, AnsweringWorker) else None
        try:
            while True:
                permits.acquire()  # the device has room for one more evaluation in its server
                held = [True]

                def answered() -> None:  # the server's job answered: the device has room again
                    if held[0]:
                        held[0] = False
                        permits.release()

                try:
                    job = self._jobs.get()
                    if job is None:
                        return
                    if self._gone[index]:  # another thread of this device lost its worker for good
                        self._jobs.put(job)
                        return
                    future, problem, source, config, problem_key, losses = job
                    if not losses and not future.set_running_or_notify_cancel():
                        continue
                    self.progress.eval_started(label, problem_key)
                    lost = False
                    try:
                        if answering is not None:
                            result = answering(problem, source, config, on_answered=answered)
                        else:
                            result = evaluator.evaluate(problem, source, config)
                        future.set_result((index, result))
                    except WorkerLost:
                        lost = True
                    except BaseException as exc:  # noqa: BLE001 - the caller gets it
                        future.set_exception(exc)
                    finally:
                        self.progress.eval_finished(label)
                    # a lost worker is revived (or given up) before the device takes another job
                    if lost and not self._lost(job, evaluator):
                        self._gone[index] = True
                        return  # this worker is gone for good; the others go on
                finally:
                    answered()
        finally:
            self._worker_ended()

    def _lost(self, job: tuple, evaluator: DispatchWorker) -> bool:
        """A worker went away (a Ray node or actor lost) in the middle of `job`: nothing of it
        was recorded, so it goes back to the queue for whichever worker is free. True when this
        worker could be replaced on its node and goes on taking jobs."""
        future, problem, source, config, problem_key, losses = job
        with self._lock:
            self.resubmitted += 1
        if losses + 1 >= self.MAX_LOSSES:  # recorded as a harness error: not kept in the store for reuse
            future.set_result((None, {"status": "harness_error", "reason": f"the worker running this evaluation "
                                      f"was lost {losses + 1} times"}))
        else:
            self._put((future, problem, source, config, problem_key, losses + 1))
        revive = getattr(evaluator, "revive", None)
        return bool(revive and revive())

    MAX_LOSSES = 3

    def _put(self, job: tuple) -> None:
        with self._lock:
            if self._alive == 0:
                job[0].set_exception(UserError(self.ALL_LOST))
                return
            self._jobs.put(job)

    ALL_LOST = ("every harness worker was lost; finished evaluations are in the store: run the same command "
                "again to go on")

    def _worker_ended(self) -> None:
        with self._lock:
            self._alive -= 1
            if self._alive > 0 or self._closing:
                return
            while True:  # nobody is left to take these: fail them rather than wait forever
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    return
                if job is not None and (job[5] or job[0].set_running_or_notify_cancel()):
                    job[0].set_exception(UserError(self.ALL_LOST))

    def close(self) -> None:
        self._closing = True
        for _ in range(len(self._threads) + sum(self.threads)):  # one end mark per job thread (and spare)
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout=60)

    def fingerprint(self) -> dict[str, Any]:
        return dict(self.fingerprints[0])

    def harness(self) -> dict[str, Any]:
        """Which harness each device's evaluations go to, for the run's record (its fingerprint's
        `harness`, shown by the report and the progress line): this user's warm harness
        (caller/daemon.py; whether this session started it) or a server of the run's own, with
        why the warm one was not used where it was asked for. Each result says the same in its
        `isolation.daemon`. A Ray worker's harness is its own."""
        devices: list[dict[str, Any]] = []
        for label, evaluator in zip(self.labels, self.pool.evaluators):
            isolation = getattr(evaluator, "isolation", None)
            daemon = isolation.get("daemon") if isinstance(isolation, dict) else None
            if isinstance(daemon, dict):
                devices.append({"device": label, "warm": True, "started_now": bool(daemon.get("started_now")),
                                "socket": daemon.get("socket")})
            else:
                devices.append({"device": label, "warm": False, **({"why": daemon} if isinstance(daemon, str) else {})})
        warm = sum(1 for d in devices if d["warm"])
        return {"kind": "warm" if devices and warm == len(devices) else "mixed" if warm else "own",
                "devices": devices}

    def keys(self, problem_sha: str, candidate_sha: str, config: dict) -> list[str]:
        keys: list[str] = []
        for fp in self.fingerprints:
            key = evaluation_key(problem_sha, candidate_sha, config, fp)
            if key not in keys:
                keys.append(key)
        return keys

    @contextlib.contextmanager
    def _timing_store(self) -> Iterator[None]:
        """Adds the time of a store call to `store_seconds` (host-time profile: a store shared by
        several GPUs' threads waits on SQLite's lock)."""
        started = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.store_seconds += time.monotonic() - started

    def evaluate(self, problem: Problem, source: str, config: EvalConfig, *, problem_key: str,
                 sample: str) -> tuple[dict, str | None, bool]:
        """(EvalResult dict, evaluation key, reused). Records the attempt in the store."""
        from concurrent.futures import Future

        from kernelagent.problem import sha256_text

        cand_sha = sha256_text(source)
        cfg = config.to_dict()
        keys = self.keys(problem.sha256, cand_sha, cfg)
        attempt = {"run_id": self.run_id, "problem_key": problem_key, "sample": sample, "candidate_sha256": cand_sha}
        while True:
            with self._timing_store():
                hit = self.store.lookup(keys)
            if hit is not None:
                key, result = hit
                with self._timing_store():
                    self.store.record_attempt({**attempt, "eval_key": key, "reused": True,
                                               "summary": summarise(result)})
                with self._lock:
                    self.reused += 1
                self.progress.eval_finished("", reused=True)
                return result, key, True
            with self._lock:  # the same evaluation already running in another thread: wait for it
                waiting = self._inflight.get(keys[0])
                if waiting is None:
                    done = self._inflight[keys[0]] = threading.Event()
                    break
            waiting.wait()  # then look again (a harness error is not stored: evaluate it here)
        try:
            future: Future = Future()
            self._put((future, problem, source, config, problem_key, 0))
            index, evaluation = future.result()
            # A local Evaluator answers an EvalResult; a Ray worker its plain dict.
            result = evaluation if isinstance(evaluation, dict) else evaluation.to_dict()
            fingerprint = result.get("fingerprint") or (self.fingerprints[index] if index is not None else {})
            key = evaluation_key(problem.sha256, cand_sha, cfg, fingerprint)
            # Every verdict is reusable except the harness's own failures (the machine's fault,
            # not the candidate's). A static compile error has no fingerprint: it needs none.
            # too_large is about this machine's free memory at the time: asked again next run.
            cacheable = result.get("status") not in ("harness_error", "too_large")
            with self._timing_store():
                self.store.record_evaluation(key, result, settings=cfg, fingerprint=fingerprint,
                                             run_id=self.run_id, cacheable=cacheable,
                                             attempt={**attempt, "eval_key": key, "reused": False,
                                                      "summary": summarise(result)})
            with self._lock:
                self.performed += 1
            return result, key, False
        finally:
            with self._lock:
                self._inflight.pop(keys[0], None)
            done.set()


def _labels(devices: list[str]) -> list[str]:
    if len(set(devices)) == len(devices):
        return list(devices)
    return [f"{d}#{i}" for i, d in enumerate(devices)]


class ProblemEvaluator:
    """What the agent sees as its evaluator: `evaluate` and `fingerprint`, through the store."""

    def __init__(self, dispatcher: StoreDispatch, problem_key: str):
        self.dispatcher, self.problem_key = dispatcher, problem_key
        self._n = 0
        self._lock = threading.Lock()

    def fingerprint(self) -> dict[str, Any]:
        return self.dispatcher.fingerprint()

    def evaluate(self, problem: Problem | str | Path, candidate_source: str, config: EvalConfig | None = None, *,
                 cancel: threading.Event | None = None) -> EvalResult:
        """EvaluatorProtocol, through the store. `cancel` is not honoured: the dispatcher's job
        threads own the evaluation (a bench run stops them all at once)."""
        from kernelagent.harness import EvalConfig, EvalResult
        from kernelagent.problem import load_problem

        if not hasattr(problem, "sha256"):
            problem = load_problem(problem)
        with self._lock:
            self._n += 1
            sample = f"eval-{self._n}"
        result, _key, _reused = self.dispatcher.evaluate(problem, candidate_source, config or EvalConfig(),
                                                         problem_key=self.problem_key, sample=sample)
        return EvalResult.from_dict(result)


# -- the run ------------------------------------------------------------------------------

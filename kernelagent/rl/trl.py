"""A reward function with TRL's GRPOTrainer contract, evaluated on the harness pool.

    from kernelagent.rl import KernelReward
    reward = KernelReward(devices=["cuda:0", "cuda:1"])     # or KernelReward(backend=pool)
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=prompts)
    # async, for GRPOTrainer's asyncio.gather path:  reward_funcs=[reward.as_async()]

TRL calls a reward function as
    fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., **dataset_columns)
(newer versions also pass `log_extra` / `log_metric`). The problem comes from a dataset
column: `problem_source` (the reference's text; preferred, it travels between machines),
else `problem_path`, else `problem`; `problem_id` names it. `kernelagent dataset prompts`
writes all three. Completions may be plain strings (standard format) or lists of message
dicts (conversational format); the candidate is the last ```python block holding
`class ModelNew` (or a `code` argument of an assistant tool call; or, failing both, the
whole text when it is a module defining `class ModelNew`).

The batch is evaluated in parallel on the pool (one harness server per GPU); identical
(problem, candidate) pairs within a batch are evaluated once. The result is one float per
completion, in order, or `None` only for infrastructure failures (the harness broke, the
problem is broken); a completion without code, or a kernel that fails, gets a number.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import logging
import threading
from concurrent.futures import Future
from typing import Any, Sequence

from kernelagent.harness import bounded_json
from kernelagent.rl.reward import (
    RewardBreakdown,
    RewardConfig,
    infra_breakdown,
    no_code_breakdown,
    reward_from_result,
)
from kernelagent import pyast

log = logging.getLogger(__name__)

PROBLEM_COLUMNS = ("problem_source", "problem_path", "problem")


class NoCandidate(ValueError):
    """The completion holds no candidate module."""


def completion_text(completion: Any) -> tuple[str, list[str]]:
    """(assistant text, code arguments of tool calls) of one completion, in order."""
    if completion is None:
        return "", []
    if isinstance(completion, str):
        return completion, []
    if isinstance(completion, dict):
        completion = [completion]
    texts, codes = [], []
    for message in completion:
        if isinstance(message, str):
            texts.append(message)
            continue
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content:
            texts.append(str(content))
        for call in message.get("tool_calls") or []:
            args = (call.get("function") or {}).get("arguments", call.get("arguments"))
            if isinstance(args, str):
                try:  # the policy's text: bounded (a 200,000-deep array raised RecursionError here)
                    args = bounded_json.loads(args.encode("utf-8", "replace"))
                except bounded_json.Refused:
                    continue
            if isinstance(args, dict) and isinstance(args.get("code"), str):
                codes.append(args["code"])
    return "\n\n".join(texts), codes


def extract_candidate(completion: Any) -> str:
    """The candidate module in a completion; NoCandidate if there is none."""
    from kernelagent.agent.loop import FormatError, extract_code

    text, codes = completion_text(completion)
    try:
        return extract_code(text)
    except FormatError as exc:
        error = str(exc)
    if codes and "class ModelNew" in codes[-1]:
        return codes[-1]
    stripped = text.strip()
    if "class ModelNew" in stripped and "```" not in stripped:
        try:
            pyast.parse(stripped)
            return stripped + "\n"
        except SyntaxError:
            pass
    raise NoCandidate(error)


def _column(kwargs: dict, name: str, n: int) -> list | None:
    value = kwargs.get(name)
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"column {name!r} has {len(value)} values for {n} completions")
    return value


def problems_from_columns(kwargs: dict, n: int) -> list[Any]:
    """One Problem (or an Exception, for that row) per completion, from the dataset columns."""
    from kernelagent.rl.problems import resolve_problem

    sources = _column(kwargs, "problem_source", n)
    paths = _column(kwargs, "problem_path", n) or _column(kwargs, "problem", n)
    ids = _column(kwargs, "problem_id", n)
    if sources is None and paths is None:
        raise ValueError("no problem column: the dataset needs `problem_source` or `problem_path` "
                         "(kernelagent dataset prompts writes both)")
    out: list[Any] = []
    cache: dict[tuple, Any] = {}
    for i in range(n):
        key = (sources[i] if sources else None, paths[i] if paths else None, ids[i] if ids else None)
        if key not in cache:
            try:
                cache[key] = resolve_problem(path=key[1], source=key[0], problem_id=key[2])
            except Exception as exc:  # a broken problem is not the policy's fault
                if key[0] is None:
                    # Read from a path the caller named: say what is wrong, never what the file
                    # holds (a reward service must not echo /etc/passwd back to a client).
                    exc = ValueError(f"problem_path {str(key[1])[:200]!r} is not a readable KernelBench problem "
                                     f"({type(exc).__name__})")
                cache[key] = exc
        out.append(cache[key])
    return out


def evaluate_batch(backend: Any, jobs: list[tuple[Any, str, Any]]) -> list[Any]:
    """Evaluate jobs in parallel on `backend`; each entry an EvalResult or the exception."""
    if hasattr(backend, "evaluate_batch"):
        return backend.evaluate_batch(jobs)
    return [_result(f) for f in [submit_job(backend, job) for job in jobs]]


def submit_job(backend: Any, job: tuple) -> Future:
    """backend.submit(*job), with a failure to submit as a failed future."""
    try:
        return backend.submit(*job)
    except Exception as exc:
        future: Future = Future()
        future.set_exception(exc)
        return future


def _result(future: Future) -> Any:
    try:
        return future.result()
    except Exception as exc:
        return exc


class DevicePlacementError(ValueError):
    """Rewards would be timed on the training process's own GPUs."""


def default_backend_args(devices: list[str] | None, cpu_workers: int = 1) -> list[str]:
    """The devices to time on when the caller did not give a backend.

    Timings only run on devices named by the caller. With none named, a process that sees no
    CUDA device uses the CPU (the Triton interpreter); one that does is refused, since the
    trainer is using those GPUs and timings next to training measure the training."""
    if devices:
        return list(devices)
    from kernelagent.harness.caller.pool import visible_gpus

    gpus = visible_gpus()
    if gpus:
        shown = ",".join(map(str, gpus))
        raise DevicePlacementError(
            f"this process sees CUDA devices ({shown}) and no reward devices were given: timings "
            "would run next to training. Pass devices=['cuda:N', ...] naming GPUs the trainer does "
            "not use, devices=['cpu'] for correctness-only rewards, or score elsewhere with "
            "`kernelagent serve` and RemoteReward(url)")
    return ["cpu"] * max(1, cpu_workers)


class KernelReward:
    """TRL-compatible reward over a harness backend (an EvaluatorPool by default, or a
    RayBackend). `last` holds the RewardBreakdowns of the latest call.

    Without a backend, evaluations run only on `devices`; with none given the CPU is used
    where the process sees no GPU, and a process that sees GPUs is refused
    (DevicePlacementError, raised here, before any training starts)."""

    __name__ = "kernel_reward"  # TRL names reward functions by __name__

    def __init__(self, backend: Any = None, *, config: RewardConfig | None = None,
                 eval_config: Any = None, devices: list[str] | None = None,
                 cpu_workers: int = 1, cache_dir: str | None = None, isolation: str = "auto",
                 judge: Any = None, dedupe: bool = True, jobs_per_device: int = 0,
                 own_backend: bool | None = None) -> None:
        self.config = config or RewardConfig()
        self.eval_config = eval_config
        self.judge = judge
        self.dedupe = dedupe
        self._own_backend = backend is None if own_backend is None else own_backend  # close() closes it
        self._backend = backend
        if backend is None:
            devices = default_backend_args(devices, cpu_workers)
        # A batch's completions go to the pool at once: each device's server runs `jobs_per_device`
        # of them together (0: its default from CPUs and memory), results come back in order.
        self._backend_args = dict(devices=devices, cache_dir=cache_dir, isolation=isolation,
                                  cpu_workers=cpu_workers, jobs_per_device=jobs_per_device)
        self._lock = threading.Lock()
        self.last: list[RewardBreakdown] = []
        self.calls = 0

    @property
    def backend(self) -> Any:
        with self._lock:
            if self._backend is None:
                from kernelagent.harness.caller.pool import EvaluatorPool

                self._backend = EvaluatorPool(**self._backend_args)
            return self._backend

    @property
    def started_backend(self) -> Any:
        """The backend if there is one yet (None: not started; asking does not start it)."""
        return self._backend

    def close(self) -> None:
        if self._own_backend and self._backend is not None:
            self._backend.close()
            self._backend = None

    def __enter__(self) -> "KernelReward":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- TRL ---------------------------------------------------------------------------
    def __call__(self, prompts: Any = None, completions: Any = None, completion_ids: Any = None,
                 **kwargs: Any) -> list[float | None]:
        breakdowns = self.score(completions, **kwargs)
        self._log(breakdowns, kwargs)
        return [b.value for b in breakdowns]

    def as_async(self):
        """An `async def` reward function (GRPOTrainer runs those with asyncio.gather)."""
        async def kernel_reward_async(prompts: Any = None, completions: Any = None,
                                      completion_ids: Any = None, **kwargs: Any) -> list[float | None]:
            breakdowns = await self.ascore(completions, **kwargs)
            self._log(breakdowns, kwargs)
            return [b.value for b in breakdowns]

        kernel_reward_async.reward = self  # type: ignore[attr-defined]
        return kernel_reward_async

    # -- scoring -----------------------------------------------------------------------
    def score(self, completions: Any, **columns: Any) -> list[RewardBreakdown]:
        prepared = self.prepare(completions, columns)
        results = evaluate_batch(self.backend, prepared["jobs"])
        return self.rewards(prepared, results)

    async def ascore(self, completions: Any, **columns: Any) -> list[RewardBreakdown]:
        prepared = self.prepare(completions, columns)
        backend = self.backend
        if hasattr(backend, "submit") and not hasattr(backend, "evaluate_batch"):
            futures: list[Future] = [submit_job(backend, job) for job in prepared["jobs"]]
            results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures),
                                           return_exceptions=True)
        else:
            results = await asyncio.to_thread(evaluate_batch, backend, prepared["jobs"])
        return await asyncio.to_thread(self.rewards, prepared, list(results))

    def prepare(self, completions: Any, columns: dict) -> dict:
        """The completions' jobs (one per distinct candidate and problem) and what each row
        maps to; `rewards` turns their results into the rewards (the reward service runs both)."""
        completions = list(completions or [])
        n = len(completions)
        problems = problems_from_columns(columns, n) if n else []
        rows: list[Any] = []  # per completion: job index, or a RewardBreakdown
        jobs: list[tuple[Any, str, Any]] = []
        index: dict[tuple[str, str], int] = {}
        for completion, problem in zip(completions, problems):
            if isinstance(problem, Exception):
                rows.append(infra_breakdown(f"problem: {problem}"))
                continue
            try:
                code = extract_candidate(completion)
            except NoCandidate as exc:
                rows.append(no_code_breakdown(str(exc)))
                continue
            key = (problem.sha256, hashlib.sha256(code.encode()).hexdigest())
            if not self.dedupe or key not in index:
                index[key] = len(jobs)
                jobs.append((problem, code, self.eval_config))
            rows.append(index[key] if self.dedupe else len(jobs) - 1)
        return {"rows": rows, "jobs": jobs}

    def rewards(self, prepared: dict, results: list[Any]) -> list[RewardBreakdown]:
        """The rewards of `prepare`'s rows, from their jobs' results (EvalResult or exception)."""
        judged: list[Any] = [None] * len(results)
        if self.judge is not None and prepared["jobs"]:
            judged = self.judge.score_many([(p.source, code) for p, code, _ in prepared["jobs"]])
        out = []
        for row in prepared["rows"]:
            if isinstance(row, RewardBreakdown):
                out.append(row)
                continue
            result = results[row]
            if isinstance(result, BaseException):
                log.warning("reward evaluation failed: %s: %s", type(result).__name__, result)
                out.append(infra_breakdown(f"{type(result).__name__}: {result}"))
            else:
                out.append(reward_from_result(result, self.config, judge=judged[row]))
        self.last = out
        self.calls += 1
        return out

    def _log(self, breakdowns: list[RewardBreakdown], kwargs: dict) -> None:
        """Feed TRL's optional per-batch logging hooks, when the trainer passes them."""
        if not breakdowns:
            return
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        try:
            if callable(log_metric):
                n = len(breakdowns)
                log_metric("kernel/compiled", sum(b.compiled for b in breakdowns) / n)
                log_metric("kernel/correct", sum(b.correct for b in breakdowns) / n)
                log_metric("kernel/infra_error", sum(b.infra_error for b in breakdowns) / n)
            if callable(log_extra):
                log_extra("kernel_status", [b.status for b in breakdowns])
        except Exception as exc:  # logging must never cost a batch its rewards
            log.debug("TRL logging hooks failed: %s", exc)


def make_reward_fn(**kwargs: Any) -> KernelReward:
    """Same as KernelReward(**kwargs)."""
    return KernelReward(**kwargs)

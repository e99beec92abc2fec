"""A batch run over a benchmark directory: candidates mode or agent mode, with resume.

    spec = BenchSpec(root="benchmarks", candidates="benchmarks/solutions", trials=5)
    outcome = run_bench(spec, Session(gpus="0,1"))

Candidates mode evaluates the files found for each problem (`discover.find_candidates`);
agent mode runs `kernelagent.orchestrate.optimize` on each problem, up to `concurrency` problems
(and so model calls) at once. Either way every evaluation goes through `Dispatcher`: the
store is asked first (content hash of problem + candidate + settings + environment), and
only a miss reaches a harness server, one job at a time per GPU.

Resume: a run's id is a hash of what it does (BenchSpec), so the same command finds the same
run; a problem whose record is stored is skipped, and within an unfinished problem each
finished evaluation is in the store. SIGKILL loses only the evaluations in flight.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelagent.bench.discover import ProblemRef, discover, find_candidates
from kernelagent.bench.folder import run_folder
from kernelagent.bench.store import Store, default_store_path, open_store
from kernelagent.bench.dispatch import Dispatcher, ProblemEvaluator, WorkerLost, harness_text, summarise  # noqa: F401
from kernelagent.errors import UserError

MODES = ("candidates", "agent")


@dataclass
class BenchSpec:
    """What a run does. Its hash is the run's id: the same spec resumes the same run."""

    root: str
    candidates: str | None = None  # a directory: candidates mode; None: agent mode
    levels: str | None = None
    filter: str | None = None
    limit: int | None = None
    # harness settings
    trials: int = 5
    timing: bool = True
    baselines: bool = True
    max_autotune: bool = False
    # Inductor modes beyond those --max-autotune gives (None: default, plus
    # max-autotune-no-cudagraphs with max_autotune); left out of the run id when None.
    inductor_modes: list[str] | None = None
    backend: str = "triton"  # "triton" or "cuda" (CUDA C++ through load_inline)
    timeouts: dict[str, float] | None = None  # StageTimeouts fields (--timeout-scale, --stage-timeout)
    # agent settings (agent mode only)
    model: str | None = None
    api_base: str | None = None
    agent_mode: str = "auto"
    max_turns: int = 20
    max_tokens: int | None = None
    max_cost: float | None = None
    timeout: float | None = None
    target_speedup: float = 1.0
    quick_trials: int = 2
    temperature: float | None = None
    # the search (kernelagent/search); left out of the run id at their defaults
    strategy: str = "single"
    samples: int = 1
    model_concurrency: int | None = None

    @property
    def mode(self) -> str:
        return "candidates" if self.candidates else "agent"

    def normalised(self) -> "BenchSpec":
        spec = dataclasses.replace(self, root=str(Path(self.root).resolve()))
        if spec.candidates:
            spec.candidates = str(Path(spec.candidates).resolve())
        return spec

    def identity(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.inductor_modes is None:  # runs started before the option keep their ids
            data.pop("inductor_modes")
        if data.get("timeouts") is None:  # runs from before the option keep their ids
            data.pop("timeouts", None)
        for name, default in (("strategy", "single"), ("samples", 1), ("model_concurrency", None)):
            if data.get(name) == default:  # runs from before the search keep their ids
                data.pop(name, None)
        if self.mode == "candidates":  # the agent's settings do not change a candidates run
            for name in ("model", "api_base", "agent_mode", "max_turns", "max_tokens", "max_cost", "timeout",
                         "target_speedup", "quick_trials", "temperature", "strategy", "samples",
                         "model_concurrency"):
                data.pop(name, None)
        return data

    def run_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]
        tag = "cand" if self.mode == "candidates" else re.sub(r"[^A-Za-z0-9_.-]+", "_",
                                                              (self.model or "agent").split("/")[-1])[:32]
        return f"{tag}-{Path(self.root).name}-{digest}"

    def eval_config(self):
        from kernelagent.harness import EvalConfig

        # audit_wins: the report counts wins, which a person reads (EvalConfig.audit_wins)
        return EvalConfig(trials=self.trials, timing=self.timing, baselines=self.baselines, backend=self.backend,
                          compile_modes=self.compile_modes(), audit_wins=True,
                          **({"timeouts": dict(self.timeouts)} if self.timeouts else {}))

    def compile_modes(self) -> tuple[str, ...]:
        if self.inductor_modes:
            return tuple(self.inductor_modes)
        return ("default", "max-autotune-no-cudagraphs") if self.max_autotune else ("default",)


@dataclass
class Session:
    """How this invocation runs (does not change what the run computes)."""

    gpus: str | None = None  # '0,1', 'cpu', None: all visible (CPU when there is none)
    cpu_workers: int = 1  # CPU harnesses (with ray: per node, on a cluster with no GPU)
    ray: str | None = None  # a Ray cluster's address, or "auto": the evaluations run there (ray_pool.py)
    ray_init: dict[str, Any] | None = None  # tests: extra ray.init arguments for a local instance
    isolation: str = "auto"
    cache_dir: str | None = None  # the harness's baseline cache
    store: str | None = None  # default: default_store_path()
    out: str | None = None  # run directory (default runs/bench/<run id>)
    concurrency: int = 4  # agent mode: problems (and so model calls) in flight at once
    jobs_per_gpu: int = 0  # evaluations each device's server runs at once (0: its default, printed)
    # Several GPUs on one host: CPUs split between the servers, the reference side's compile
    # cache shared, each problem's baselines timed once, and candidates queued round-robin over
    # problems (EvaluatorPool). False: as before, for bench_throughput.py's before/after.
    host_tuning: bool = True
    pin_cpus: bool = True  # with host_tuning: each server pinned to its share of the CPUs
    # This user's warm harness per device (caller/daemon.py), reused by the next batch of the same
    # settings; None: KERNELAGENT_DAEMON, off where unset (the library's rule; `kernelagent bench`
    # resolves it to on by default, cli/bench_cmd.py). Not with --ray (its workers hold their own).
    daemon: bool | None = None
    run_name: str | None = None  # override the derived run id
    force: bool = False  # let `out` replace another run's report there (bench/folder.py)
    api_key: str | None = None
    model_timeout: float = 300.0
    max_retries: int = 6
    retry_backoff: float = 2.0
    model_factory: Callable[[BenchSpec], Any] | None = None  # tests/scripts: build the model


@dataclass
class BenchOutcome:
    run_id: str
    out_dir: Path
    store_path: Path
    metrics: dict[str, Any]
    evaluations: int  # performed by the harness in this session
    reused: int  # answered from the store in this session
    resumed: bool
    skipped: int  # problems already finished before this session
    resubmitted: int = 0  # evaluations sent to another worker after theirs was lost (--ray)
    store_seconds: float = 0.0  # the dispatcher's store calls, summed over its threads
    records: list[dict] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 0 if self.metrics.get("correct") else 1

    @property
    def model_unavailable(self) -> str | None:
        """Why the batch stopped: a problem's model did not answer (`bench` exits 5); else None."""
        return next((str(r.get("reason") or "") for r in self.records if r.get("status") == "model_unavailable"),
                    None)


# -- turning evaluation results into records ----------------------------------------------
def skipped_record(ref: ProblemRef, reason: str) -> dict[str, Any]:
    """A problem that was not evaluated for a reason that is neither the candidate's nor the
    agent's (a package the problem needs is missing). Left out of every rate (metrics.py)."""
    return {"key": ref.key, "level": ref.level, "name": ref.name, "status": "skipped", "skip_reason": reason,
            "reason": f"skipped: {reason}", "compiled": False, "correct": False, "speedup_eager": None,
            "speedup_inductor": None, "timings_meaningful": False, "samples": 0, "correct_samples": 0,
            "compiled_samples": 0, "tokens": {"prompt": 0, "completion": 0, "total": 0}, "cost_usd": 0.0,
            "wall_s": 0.0, "evaluations": 0, "reused": 0}


def _rank(summary: dict) -> tuple:
    """Best sample first: passed, then the speedup as fast_p judges it (the interval's low end,
    the point estimate without one), then the point estimate, then compiled."""
    from kernelagent.bench import metrics as M

    record = {**summary, "correct": summary.get("passed")}
    base = "inductor" if summary.get("speedup_inductor") else "eager"
    return (bool(summary.get("passed")), M.speedup_low(record, base) or 0.0, M.speedup(record, base) or 0.0,
            bool(summary.get("compiled")))


def candidates_record(ref: ProblemRef, attempts: list[dict]) -> dict[str, Any]:
    """A problem's record from its samples: the best sample stands for the problem (best-of-k)."""
    base = {"key": ref.key, "level": ref.level, "name": ref.name, "tokens": {"prompt": 0, "completion": 0, "total": 0},
            "cost_usd": 0.0, "samples": len(attempts)}
    if not attempts:
        return {**base, "status": "missing", "compiled": False, "correct": False, "speedup_eager": None,
                "speedup_inductor": None, "timings_meaningful": False, "correct_samples": 0,
                "compiled_samples": 0, "reason": "no candidate file", "wall_s": 0.0, "evaluations": 0,
                "reused": 0, "best_sample": None, "sample_results": []}
    best = max(attempts, key=lambda a: _rank(a["summary"]))
    s = best["summary"]
    return {**base, "status": s["status"], "compiled": any(a["summary"]["compiled"] for a in attempts),
            "correct": bool(s["passed"]), "speedup_eager": s["speedup_eager"],
            "speedup_inductor": s["speedup_inductor"], "timings_meaningful": s["timings_meaningful"],
            "interval_eager": s.get("interval_eager"), "interval_inductor": s.get("interval_inductor"),
            "raw_speedups": s.get("raw_speedups") or {} if s["timings_meaningful"] else {},
            "raw_intervals": s.get("raw_intervals") or {} if s["timings_meaningful"] else {},
            "correct_samples": sum(1 for a in attempts if a["summary"]["passed"]),
            "compiled_samples": sum(1 for a in attempts if a["summary"]["compiled"]),
            "reason": s.get("reason", ""), "flags": s.get("flags", []),
            "wall_s": round(sum(a["summary"].get("seconds") or 0.0 for a in attempts if not a["reused"]), 3),
            "evaluations": sum(1 for a in attempts if not a["reused"]),
            "reused": sum(1 for a in attempts if a["reused"]), "best_sample": best["sample"],
            "sample_results": [{"sample": a["sample"], "status": a["summary"]["status"],
                                "passed": a["summary"]["passed"]} for a in attempts]}


# -- the evaluation dispatcher ------------------------------------------------------------
def run_bench(spec: BenchSpec | None, session: Session, *, resume: str | None = None,
              progress: BenchProgress | None = None) -> BenchOutcome:
    from kernelagent.bench.progress import BenchProgress
    from kernelagent.bench.report import write_reports, write_run_json
    from kernelagent.harness.caller.pool import EvaluatorPool, parse_gpus
    from kernelagent.problem import load_problem, missing_dependency, parse_source

    store_path = Path(session.store) if session.store else default_store_path()
    store = open_store(store_path)
    progress = progress or BenchProgress(quiet=True)
    known = None
    try:
        if resume:
            known = run = store.run(resume)
            if run is None:
                raise UserError(f"no run {resume!r} in the store {store_path}")
            spec = BenchSpec(**run["spec"])
            run_id = resume
        else:
            if spec is None:
                raise UserError("nothing to run: give a benchmark directory or --resume RUN")
            spec = spec.normalised()
            run_id = session.run_name or spec.run_id()
            known = store.run(run_id)
            if known is not None and known["spec"] != dataclasses.asdict(spec):
                if session.run_name:
                    raise UserError(f"run {run_id!r} exists with different settings; pick another --run name")
        if spec.candidates and not Path(spec.candidates).is_dir():
            raise UserError(f"candidates directory not found: {spec.candidates}")
        if spec.mode == "agent" and not spec.model and session.model_factory is None:
            raise UserError("agent mode needs a model: give --model (or KERNELAGENT_MODEL), "
                            "or --candidates CDIR to evaluate existing candidates")
        refs = discover(spec.root, spec.levels, spec.filter, spec.limit)
        if not refs:
            raise UserError(f"no problems found under {spec.root}"
                            + (" with those --levels/--filter" if spec.levels or spec.filter else ""))
        problems = {ref.key: (ref, load_problem(ref.path, check_dependencies=False)) for ref in refs}
        # A problem whose imports are not installed here (KernelBench's level3/48 imports einops)
        # is skipped, not failed: it says nothing about the candidate. Asked again on every
        # session, so installing the package and running the same command evaluates it.
        skipped = {key: skipped_record(ref, f"missing dependency {package}")
                   for key, (ref, problem) in problems.items()
                   if (package := missing_dependency(parse_source(problem.source, str(ref.path)))) is not None}
        # The folder is checked (and made) before the run is recorded: a bad --out is one line,
        # and never leaves a run in the store pointing at it.
        out_dir = run_folder(run_id=run_id, store_path=store_path, explicit=session.out,
                             recorded=known["out_dir"] if known else None, force=session.force)
        run, created = store.open_run(run_id, spec.mode, dataclasses.asdict(spec), str(out_dir.resolve()))
        write_run_json(out_dir, run_id, store_path)
        store.add_problems(run_id, [{"key": k, "level": ref.level, "name": ref.name, "path": str(ref.path),
                                     "sha256": p.sha256} for k, (ref, p) in problems.items()])
        for key, record in skipped.items():
            store.finish_problem(run_id, key, "done", record)
        rows = {row["key"]: row for row in store.problems(run_id)}
        todo = [k for k in problems if k not in skipped and not (
            rows[k]["status"] == "done" and rows[k]["sha256"] == problems[k][1].sha256
            and (rows[k]["record"] or {}).get("status") not in ("skipped", "too_large")
            and _candidates_unchanged(store, run_id, spec, problems[k][0], rows[k]))]
        done_before = len(problems) - len(todo)
        correct_before = sum(1 for k in problems if k not in todo and (rows[k]["record"] or {}).get("correct"))
        started = time.monotonic()
        devices = parse_gpus(session.gpus)
        if devices == ["cpu"]:
            devices = ["cpu"] * max(1, session.cpu_workers)
        status, performed, reused, resubmitted, store_seconds = "failed", 0, 0, 0, 0.0
        try:
            with progress:
                if todo:
                    with ExitStack() as stack:
                        if session.ray:
                            from kernelagent.bench.ray_pool import RayPool

                            pool = stack.enter_context(RayPool(
                                session.ray, cpu_workers=max(1, session.cpu_workers),
                                cache_dir=session.cache_dir, isolation=session.isolation,
                                init_kwargs=session.ray_init, jobs_per_device=session.jobs_per_gpu))
                        else:
                            pool = stack.enter_context(EvaluatorPool(
                                devices=devices, cache_dir=session.cache_dir, isolation=session.isolation,
                                cpu_workers=max(1, session.cpu_workers), host_tuning=session.host_tuning,
                                jobs_per_device=session.jobs_per_gpu, pin_cpus=session.pin_cpus,
                                daemon=session.daemon))
                        dispatcher = Dispatcher(pool, store, run_id, progress)
                        stack.callback(dispatcher.close)
                        # The run's record says which harness this session used (the report's header).
                        harness = dispatcher.harness()
                        store.update_run(run_id, fingerprint={**dispatcher.fingerprint(), "harness": harness})
                        parallel = dispatcher.parallel if spec.mode == "candidates" else session.concurrency
                        progress.begin(run_id, spec.mode, len(problems), done_before, correct_before,
                                       dispatcher.labels, parallel, resumed=not created,
                                       jobs="; ".join(t for t in (dispatcher.describe(), harness_text(harness)) if t))
                        try:
                            if spec.mode == "candidates":
                                _run_candidates(spec, store, run_id, dispatcher, progress,
                                                [problems[k] for k in todo], workers=dispatcher.queue_depth,
                                                interleave=session.host_tuning)
                            else:
                                _run_agent(spec, session, store, run_id, dispatcher, progress,
                                           [problems[k] for k in todo], out_dir)
                        finally:
                            performed, reused = dispatcher.performed, dispatcher.reused
                            resubmitted = dispatcher.resubmitted
                            store_seconds = dispatcher.store_seconds
                else:  # nothing left: no harness server is started
                    progress.begin(run_id, spec.mode, len(problems), done_before, correct_before, [], 1,
                                   resumed=not created)
                unfinished = [r["key"] for r in store.problems(run_id) if r["status"] != "done"]
                status = "finished" if not unfinished else "incomplete"
                store.update_run(run_id, status=status, add_wall_s=time.monotonic() - started)
                started = time.monotonic()
                write_reports(store, run_id, out_dir)
                from kernelagent.bench.report import load_run

                metrics = load_run(store, run_id)["metrics"]
                records = [r["record"] for r in store.problems(run_id) if r["record"]]
                progress.end(metrics, str(out_dir), performed)
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            raise
        finally:
            store.update_run(run_id, status=status, add_wall_s=time.monotonic() - started)
        return BenchOutcome(run_id=run_id, out_dir=out_dir, store_path=store_path, metrics=metrics,
                            evaluations=performed, reused=reused, resumed=not created,
                            skipped=done_before, resubmitted=resubmitted, store_seconds=store_seconds,
                            records=records)
    finally:
        store.close()


def _candidates_unchanged(store: Store, run_id: str, spec: BenchSpec, ref: ProblemRef, row: dict) -> bool:
    """A finished candidates-mode problem stays finished while its candidate files are the same."""
    if spec.mode != "candidates":
        return True
    from kernelagent.problem import sha256_text

    files = find_candidates(Path(spec.candidates), ref)
    current = {(p.name, sha256_text(p.read_text(encoding="utf-8", errors="replace"))) for p in files}
    stored = {(a["sample"], a["candidate_sha256"]) for a in store.attempts(run_id, ref.key)}
    return current == stored


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"# unreadable candidate file: {exc}\n"


def _run_candidates(spec: BenchSpec, store: Store, run_id: str, dispatcher: Dispatcher, progress: BenchProgress,
                    todo: list[tuple[ProblemRef, Any]], workers: int, interleave: bool = True) -> None:
    from kernelagent.problem import sha256_text

    config = spec.eval_config()
    cdir = Path(spec.candidates)
    pending: dict[str, int] = {}
    files: dict[str, list[Path]] = {}
    jobs = []
    for ref, problem in todo:
        samples = find_candidates(cdir, ref)
        files[ref.key] = samples
        names = {p.name for p in samples}
        stored = {a["sample"]: a for a in store.attempts(run_id, ref.key)}
        with store.transaction() as db:  # forget attempts of samples that changed or disappeared
            for name, attempt in stored.items():
                if name not in names:
                    db.execute("DELETE FROM attempts WHERE id = ?", (attempt["id"],))
        for path in samples:
            source = _read(path)
            old = stored.get(path.name)
            if old is not None and old["candidate_sha256"] == sha256_text(source):
                continue  # finished in an earlier session
            jobs.append((ref, problem, path.name, source))
        pending[ref.key] = sum(1 for j in jobs if j[0].key == ref.key)

    if interleave:
        jobs = interleaved(jobs)
    refs = {ref.key: ref for ref, _ in todo}

    def finish(key: str) -> None:
        record = candidates_record(refs[key], store.attempts(run_id, key))
        store.finish_problem(run_id, key, "done", record)
        progress.problem_finished(key, record)

    for key, count in pending.items():
        if count == 0:
            finish(key)
    if not jobs:
        return
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bench-eval") as ex:
        futures = {ex.submit(dispatcher.evaluate, problem, source, config, problem_key=ref.key, sample=name): ref.key
                   for ref, problem, name, source in jobs}
        try:
            for future in as_completed(futures):
                key = futures[future]
                future.result()
                pending[key] -= 1
                if pending[key] == 0:
                    finish(key)
        except BaseException:
            ex.shutdown(wait=False, cancel_futures=True)
            raise


def interleaved(jobs: list[tuple]) -> list[tuple]:
    """Round-robin over problems: every problem's first sample, then every second one, and so
    on. Queued problem by problem, two GPUs would take two samples of one problem at once and
    both miss its baselines; this way a problem's later samples find them cached (and when
    they still collide, BaselineCache.claim makes one wait rather than both compile)."""
    by_problem: dict[str, list[tuple]] = {}
    for job in jobs:
        by_problem.setdefault(job[0].key, []).append(job)
    lanes = list(by_problem.values())
    return [lane[i] for i in range(max(map(len, lanes), default=0)) for lane in lanes if i < len(lane)]


def _default_model(spec: BenchSpec, session: Session) -> Any:
    from kernelagent.models import make_model

    return make_model(spec.model, api_base=spec.api_base, api_key=session.api_key, timeout=session.model_timeout,
                      max_retries=session.max_retries, backoff_base=session.retry_backoff,
                      temperature=spec.temperature)


def _safe_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "__", key)


def agent_record(ref: ProblemRef, summary: dict, attempts: list[dict], wall_s: float) -> dict[str, Any]:
    best = summary.get("best") or {}
    correct = summary.get("outcome") in ("success", "short_of_target")
    meaningful = bool(best.get("timings_meaningful"))
    return {"key": ref.key, "level": ref.level, "name": ref.name,
            "status": best.get("verdict") if best else ("no_correct_kernel" if attempts else "no_candidate"),
            "outcome": summary.get("outcome"), "compiled": any(a["summary"]["compiled"] for a in attempts),
            "correct": correct,
            "speedup_eager": best.get("speedup_vs_eager") if correct and meaningful else None,
            "speedup_inductor": best.get("speedup_vs_inductor") if correct and meaningful else None,
            "interval_eager": (best.get("speedup_intervals") or {}).get("eager") if correct and meaningful else None,
            "interval_inductor": (best.get("speedup_intervals") or {}).get("compile")
            if correct and meaningful else None,
            "raw_speedups": best.get("raw_speedups") or {} if meaningful else {},
            "raw_intervals": best.get("speedup_intervals") or {} if meaningful else {},
            "timings_meaningful": meaningful,
            "samples": 1, "correct_samples": int(correct), "compiled_samples": int(any(
                a["summary"]["compiled"] for a in attempts)),
            "tokens": summary.get("tokens") or {}, "cost_usd": summary.get("cost_usd") or 0.0,
            "cost_known": summary.get("cost_known"), "turns": summary.get("turns"),
            "wall_s": round(wall_s, 3), "evaluations": sum(1 for a in attempts if not a["reused"]),
            "reused": sum(1 for a in attempts if a["reused"]), "stop_reason": summary.get("stop_reason"),
            "target_check": summary.get("target_check"), "kernel": best.get("kernel"),
            "out_dir": summary.get("out_dir"), "reason": summary.get("stop_detail") or "",
            **({"search": summary["search"]} if summary.get("search") else {})}


def _run_agent(spec: BenchSpec, session: Session, store: Store, run_id: str, dispatcher: Dispatcher,
               progress: BenchProgress, todo: list[tuple[ProblemRef, Any]], out_dir: Path) -> None:
    from kernelagent.orchestrate import optimize
    from kernelagent.agent.budget import Budget
    from kernelagent.problem import ProblemError

    overrides: dict[str, Any] = {"compile_modes": spec.compile_modes()} if spec.compile_modes() != ("default",) \
        else {}
    overrides["baselines"] = spec.baselines
    if spec.timeouts:
        overrides["timeouts"] = dict(spec.timeouts)
    stop = threading.Event()

    def one(ref: ProblemRef) -> None:
        if stop.is_set():
            return
        store.start_problem(run_id, ref.key, clear_attempts=True)  # a killed try starts over
        progress.agent_started(ref.key)
        model = session.model_factory(spec) if session.model_factory else _default_model(spec, session)
        budget = Budget(max_turns=spec.max_turns, max_tokens=spec.max_tokens, max_cost=spec.max_cost,
                        timeout=spec.timeout)
        seen = {"tokens": 0, "cost": 0.0}
        charging = threading.Lock()  # a search's model calls report from several threads

        def observer(event: str, **data: Any) -> None:
            if event == "model":
                with charging:
                    tokens, cost = budget.tokens, budget.cost
                    progress.charge(tokens - seen["tokens"], cost - seen["cost"])
                    seen.update(tokens=tokens, cost=cost)

        started = time.monotonic()
        try:
            result = optimize(ref.path, model, mode=spec.agent_mode, budget=budget, backend=spec.backend,
                              target_speedup=spec.target_speedup, out=out_dir / "problems" / _safe_name(ref.key),
                              trials=spec.trials, quick_trials=min(spec.quick_trials, spec.trials),
                              eval_overrides=overrides, evaluator=ProblemEvaluator(dispatcher, ref.key),
                              observer=observer, model_info={"api_base": spec.api_base,
                                                             "temperature": spec.temperature},
                              strategy=spec.strategy, samples=spec.samples,
                              model_concurrency=spec.model_concurrency)
        except ProblemError as exc:
            record = {"key": ref.key, "level": ref.level, "name": ref.name, "status": "bad_problem",
                      "compiled": False, "correct": False, "samples": 0, "correct_samples": 0,
                      "reason": str(exc), "wall_s": round(time.monotonic() - started, 3),
                      "tokens": {"prompt": budget.prompt_tokens, "completion": budget.completion_tokens,
                                 "total": budget.tokens}, "cost_usd": budget.cost}
            store.finish_problem(run_id, ref.key, "done", record)
            progress.problem_finished(ref.key, record)
            return
        except UserError:
            stop.set()  # a refused key or a bad model: every other problem would fail the same way
            raise
        except Exception as exc:  # noqa: BLE001 - one problem's failure must not end the batch
            record = {"key": ref.key, "level": ref.level, "name": ref.name, "status": "error",
                      "compiled": False, "correct": False, "samples": 0, "correct_samples": 0,
                      "reason": f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                      "wall_s": round(time.monotonic() - started, 3),
                      "tokens": {"prompt": budget.prompt_tokens, "completion": budget.completion_tokens,
                                 "total": budget.tokens}, "cost_usd": budget.cost}
            store.finish_problem(run_id, ref.key, "error", record)  # retried on resume
            progress.problem_finished(ref.key, record)
            return
        record = agent_record(ref, result.summary, store.attempts(run_id, ref.key), time.monotonic() - started)
        progress.charge(int((record["tokens"] or {}).get("total") or 0) - seen["tokens"],
                        float(record["cost_usd"] or 0.0) - seen["cost"])
        if record["outcome"] == "model_unavailable":
            # The model did not answer (timeout and retries spent): not the problem's result. It is
            # asked again on resume, and no other problem starts (each would wait the same way).
            record["status"] = "model_unavailable"
            stop.set()
            store.finish_problem(run_id, ref.key, "error", record)
            progress.problem_finished(ref.key, record)
            return
        store.finish_problem(run_id, ref.key, "done", record)
        progress.problem_finished(ref.key, record)

    with ThreadPoolExecutor(max_workers=max(1, session.concurrency), thread_name_prefix="bench-agent") as ex:
        futures = [ex.submit(one, ref) for ref, _problem in todo]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            stop.set()
            ex.shutdown(wait=False, cancel_futures=True)
            raise

"""A pool of evaluators: one harness server per GPU, used from many threads.

Each Evaluator's server runs several jobs at once (`jobs_per_device`; 0: the server's default,
from the host's CPUs and the device's memory), with every timed phase alone on its device
(server/gate.py); jobs go to the evaluator with the fewest in flight. Without a GPU the pool has
`cpu_workers` CPU evaluators.

    with EvaluatorPool() as pool:                       # all visible GPUs
        results = pool.map([(problem, source, config), ...])   # order kept
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from kernelagent.harness.config import EvalConfig
from kernelagent.harness.caller.evaluator import Evaluator
from kernelagent.harness.result import EvalResult
from kernelagent.problem import Problem


def visible_gpus() -> list[int]:
    """GPU indices this process may use, without initialising CUDA here."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        env = env.strip()
        if not env or env == "-1":
            return []
        return [int(x) for x in env.split(",") if x.strip().isdigit()]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [int(line) for line in out.stdout.split() if line.strip().isdigit()]


def parse_gpus(spec: str | None) -> list[str] | None:
    """'0,1' -> ['cuda:0', 'cuda:1']; 'cpu' -> ['cpu']; None/'all' -> None (all visible)."""
    if spec is None or spec.strip().lower() in ("", "all"):
        return None
    if spec.strip().lower() == "cpu":
        return ["cpu"]
    devices = []
    for part in spec.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--gpus takes indices like 0,1 (or 'cpu' / 'all'), got {spec!r}")
        devices.append(f"cuda:{part}")
    return devices


def split_cpus(n: int, available: Iterable[int] | None = None) -> list[list[int] | None]:
    """`n` disjoint, contiguous, near-equal shares of this process's CPUs, one per evaluator;
    [None] * n (no pinning) when there is one evaluator or fewer CPUs than evaluators."""
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    if n <= 1 or len(cpus) < n:
        return [None] * max(n, 0)
    base, extra = divmod(len(cpus), n)
    shares, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        shares.append(cpus[start:start + size])
        start += size
    return shares


class EvaluatorPool:
    """`host_tuning` (default on) is what lets several GPUs of one host scale (issue 17's
    measures): each server pinned to its own share of the CPUs, the reference side's compile
    cache shared, and the baselines of a problem timed once (BaselineCache.claim). Off, the
    evaluators run as they did before, for benchmarks/bench_throughput.py's before/after.

    `daemon` as Evaluator(daemon=) takes it (None: KERNELAGENT_DAEMON, off where unset): each
    device's evaluator then uses this user's warm harness of its settings (its device, visible
    devices and CPUs are in the key, so one per GPU), and the next pool of the same settings finds
    them warm (caller/daemon.py)."""

    def __init__(self, devices: list[str] | None = None, cache_dir: str | Path | None = None,
                 isolation: str = "auto", cpu_workers: int = 1, host_tuning: bool = True,
                 jobs_per_device: int = 0, pin_cpus: bool = True, *, daemon: bool | None = None):
        if devices is None:
            gpus = visible_gpus()
            devices = [f"cuda:{i}" for i in gpus] if gpus else ["cpu"] * max(1, cpu_workers)
        self.devices = devices
        # pin_cpus=False: the tuning without the split (every server on every CPU), to measure it
        shares = split_cpus(len(devices)) if host_tuning and pin_cpus else [None] * len(devices)
        self.evaluators = [Evaluator(device=d, cache_dir=cache_dir, isolation=isolation, cpus=cpus,
                                     share_compile_cache=host_tuning, coordinate_baselines=host_tuning,
                                     concurrency=jobs_per_device, daemon=daemon)
                           for d, cpus in zip(devices, shares)]
        self._load = {id(e): 0 for e in self.evaluators}
        self._load_lock = threading.Lock()
        # Enough threads to keep every server's admission full (the servers bound the real work).
        per = jobs_per_device if jobs_per_device > 0 else 8
        self._executor = ThreadPoolExecutor(max_workers=len(self.evaluators) * per,
                                            thread_name_prefix="kernelagent-eval")

    def __enter__(self) -> "EvaluatorPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def size(self) -> int:
        return len(self.evaluators)

    def fingerprint(self) -> dict[str, Any]:
        return self.evaluators[0].fingerprint()

    def _take(self) -> Evaluator:
        with self._load_lock:
            evaluator = min(self.evaluators, key=lambda e: self._load[id(e)])
            self._load[id(evaluator)] += 1
            return evaluator

    def evaluate(self, problem: Problem | str | Path, candidate_source: str,
                 config: EvalConfig | None = None, *, cancel: threading.Event | None = None) -> EvalResult:
        """Evaluates on the evaluator with the fewest jobs in flight (its server queues the job
        when it already runs as many as it admits); `cancel` as Evaluator.evaluate has it."""
        evaluator = self._take()
        try:
            return evaluator.evaluate(problem, candidate_source, config, cancel=cancel)
        finally:
            with self._load_lock:
                self._load[id(evaluator)] -= 1

    def submit(self, problem: Problem | str | Path, candidate_source: str,
               config: EvalConfig | None = None) -> Future:
        return self._executor.submit(self.evaluate, problem, candidate_source, config)

    def map(self, jobs: Iterable[tuple[Problem | str | Path, str, EvalConfig | None]]) -> list[EvalResult]:
        futures = [self.submit(*job) for job in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        for evaluator in self.evaluators:
            evaluator.close()

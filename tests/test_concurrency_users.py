"""Everyone uses the overlap (issue 23, scope 3): bench's dispatcher keeps as many evaluations
in flight per device as that device's server admits, `verify` sends its kernels at once and
reports them in the manifest's order, `KernelReward` and the CLI pass the jobs per GPU on,
and the chosen number is printed. Stand-in evaluators here; the real servers' overlap is
tests/test_concurrency.py's."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kernelagent.bench.runner import Dispatcher
from tests.conftest import TESTS
from tests.test_bench_ray import _evaluate_all, _Pool, _Progress, _Store


class _Concurrent:
    """An evaluator whose server admits `jobs` at once: counts how many calls overlap."""

    def __init__(self, name: str, jobs: int, seconds: float = 0.15):
        self.name, self.jobs, self.seconds = name, jobs, seconds
        self.running = self.peak = 0
        self.lock = threading.Lock()
        self.done: list[str] = []
        self.closed_from: str | None = None

    def fingerprint(self):
        return {"python": "x", "concurrency": {"jobs": self.jobs, "default": self.jobs, "why": "test: two CPUs"}}

    def evaluate(self, problem, source, config):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
            self.done.append(source)
        return {"status": "correct", "compiled": True, "correct": True, "fingerprint": {"python": "x"}}

    def close(self):
        self.closed_from = threading.current_thread().name


def test_bench_dispatcher_keeps_each_devices_admitted_jobs_in_flight():
    wide, narrow = _Concurrent("cuda:0", jobs=3), _Concurrent("cuda:1", jobs=1)
    dispatcher = Dispatcher(_Pool([wide, narrow]), _Store(), "run", _Progress())
    try:
        assert dispatcher.slots == [3, 1] and dispatcher.parallel == 4
        assert "3 jobs at once per device (test: two CPUs)" in dispatcher.describe()
        assert "1 job at once per device" in dispatcher.describe()
        results, errors = _evaluate_all(dispatcher, 12)
    finally:
        dispatcher.close()
    assert not errors and len(results) == 12
    assert wide.peak == 3  # as many as its server admits, never more
    assert narrow.peak == 1
    assert sorted(wide.done + narrow.done) == sorted(f"candidate {i}" for i in range(12))  # each once
    assert len(wide.done) > len(narrow.done)
    # Each server is closed by the thread that started it (bubblewrap's --die-with-parent).
    assert wide.closed_from == "bench-device-0" and narrow.closed_from == "bench-device-1"


class _Answering(_Concurrent):
    """A local harness standing in (Evaluator.evaluate_answering): its server's job takes
    `seconds`, then the result waits `baselines_s` more for the problem's baselines."""

    def __init__(self, name: str, jobs: int, seconds: float = 0.1, baselines_s: float = 0.6):
        super().__init__(name, jobs, seconds)
        self.baselines_s = baselines_s
        self.answered_at: dict[str, float] = {}
        self.started_at: dict[str, float] = {}
        self.ended_at: dict[str, float] = {}

    def evaluate_answering(self, problem, source, config=None, *, cancel=None, on_answered=None):
        with self.lock:
            self.started_at[source] = time.monotonic()
            self.running += 1  # in the server
            self.peak = max(self.peak, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
            self.answered_at[source] = time.monotonic()
        if on_answered is not None:
            on_answered()
        time.sleep(self.baselines_s)  # the result waits for its problem's baselines
        with self.lock:
            self.done.append(source)
            self.ended_at[source] = time.monotonic()
        return {"status": "correct", "compiled": True, "correct": True, "fingerprint": {"python": "x"}}


def test_a_device_takes_its_next_job_while_an_answered_result_waits_for_baselines():
    """Issue 59 (session 36): a one-GPU bench's first wave held the device's room while its
    results waited for their problems' baselines, and the server idled. Once its server job has
    answered, an evaluation gives the room back: the next job starts in the server before the
    first result is back, and the server never runs more than it admits."""
    device = _Answering("cuda:0", jobs=2)
    dispatcher = Dispatcher(_Pool([device]), _Store(), "run", _Progress())
    try:
        assert dispatcher.slots == [2] and dispatcher.parallel == 2 and dispatcher.queue_depth == 4
        results, errors = _evaluate_all(dispatcher, 4)
    finally:
        dispatcher.close()
    assert not errors and len(results) == 4 and sorted(device.done) == [f"candidate {i}" for i in range(4)]
    assert device.peak == 2  # never more in the server than it admits
    first_two = sorted(device.started_at, key=device.started_at.get)[:2]
    last_two = sorted(device.started_at, key=device.started_at.get)[2:]
    first_result = min(device.ended_at[s] for s in first_two)
    # the third and fourth jobs started in the server before any first result came back
    assert all(device.started_at[s] < first_result for s in last_two), (device.started_at, device.ended_at)
    assert all(device.started_at[s] >= min(device.answered_at[f] for f in first_two) - 0.01 for s in last_two)


def test_bench_progress_line_prints_the_jobs_per_device(capsys):
    from kernelagent.bench.progress import BenchProgress

    progress = BenchProgress(quiet=False, live=False)
    progress.begin("run", "candidates", 3, 0, 0, ["cuda:0"], 4, resumed=False,
                   jobs="4 jobs at once per device (min(16 CPUs / 2, 70 GiB free / 4 GiB, 8))")
    out = capsys.readouterr()
    assert "evaluating on cuda:0, 4 jobs at once per device (min(16 CPUs / 2" in out.out + out.err


class _Cached:
    """verify's CachedEvaluator, standing in: `jobs` at once, slower for the first kernel."""

    cpu = True

    def __init__(self, jobs: int):
        self.jobs, self.running, self.peak, self.lock = jobs, 0, 0, threading.Lock()
        self.performed = self.reused = 0
        self.evaluator = self

    def fingerprint(self):
        return {"python": "x", "cuda": False}

    def evaluate_cached(self, problem, source, config):
        from kernelagent.harness import EvalResult

        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.4 if "relu" in problem.display else 0.1)
        with self.lock:
            self.running -= 1
        return EvalResult(status="correct", compiled=True, correct=True), False


def test_verify_sends_kernels_at_once_and_reports_in_manifest_order():
    from kernelagent.ci.manifest import load_manifest
    from kernelagent.ci.verify import evaluate_entries

    manifest = load_manifest(Path(TESTS) / "ci_repo")
    entries = manifest.select(None)
    cached, seen = _Cached(jobs=3), []
    checks = evaluate_entries(manifest, entries, cached, {}, on_check=lambda c: seen.append(c.name))
    assert cached.peak == 3  # all three kernels at once
    assert [c.name for c in checks] == [e.name for e in entries]  # the report keeps the manifest's order
    assert seen[-1] == entries[0].name  # while progress lines come as each finishes (relu is slowest)
    serial = _Cached(jobs=1)
    evaluate_entries(manifest, entries, serial, {})
    assert serial.peak == 1


def test_kernel_reward_and_the_pool_pass_the_jobs_per_device_on(tmp_path):
    from kernelagent.rl.trl import KernelReward

    reward = KernelReward(devices=["cpu"], cache_dir=str(tmp_path), jobs_per_device=3)
    try:
        pool = reward.backend
        assert [e.concurrency_requested for e in pool.evaluators] == [3]
    finally:
        reward.close()


def test_cli_jobs_per_gpu_option_is_checked_and_documented():
    from typer.testing import CliRunner

    from kernelagent.cli import app

    runner = CliRunner()
    for command in ("bench", "verify", "serve"):
        shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and "--jobs-per-gpu" in shown.output, command
    bad = runner.invoke(app, ["bench", str(Path(TESTS) / "bench_suite"), "--jobs-per-gpu", "9"])
    assert bad.exit_code == 2 and "--jobs-per-gpu" in bad.output

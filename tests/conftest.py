"""Shared fixtures. The harness fixtures start one harness server per test session: each
evaluation still runs in fresh processes, but the server's imports are paid once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.file_budget import pytest_runtest_protocol, pytest_runtest_setup  # noqa: F401 - hooks: each GPU file's own time budget

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
CANDIDATES = TESTS / "candidates"
BENCHMARKS = REPO / "benchmarks"
# The GPU files whose subject is not the kernel evidence (the KernelBench and benchmark solution
# sweeps) run without it, so that the whole GPU suite fits one device call: one ncu session per
# win, one at a time on a host, would add minutes. KERNELAGENT_GPU_EVIDENCE=1 turns it on there
# too (honest solutions must then still pass: a false rejection by the evidence shows).
GPU_SWEEP_EVIDENCE = os.environ.get("KERNELAGENT_GPU_EVIDENCE") == "1"

# Rich output in CLI tests renders at a fixed width.
os.environ.setdefault("COLUMNS", "120")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernelagent-cache")


@pytest.fixture(scope="session")
def evaluator(cache_dir):
    from kernelagent.harness import Evaluator

    with Evaluator(device="auto", cache_dir=cache_dir) as ev:
        yield ev


@pytest.fixture(scope="session")
def cuda_evaluator(cache_dir):
    """One harness server on the GPU for every GPU test file: its start (imports, the device
    probe) is paid once, and CUDA builds and compiled references are cached across the files.
    Files that submit their cases at once (submit_all) overlap their host work in it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kernelagent.harness import Evaluator

    with Evaluator(device="cuda", cache_dir=cache_dir) as ev:
        yield ev


class Submitted:
    """Cases handed to one evaluator at once; `[key]` waits for that case's result, and
    `.seconds[key]` is how long it took from submission (queueing beside the others included)."""

    def __init__(self, evaluator, cases: dict):
        import time
        from concurrent.futures import ThreadPoolExecutor

        self.seconds: dict = {}
        self._pool = ThreadPoolExecutor(max_workers=max(len(cases), 1))

        def run(key, args):
            start = time.monotonic()
            try:
                return evaluator.evaluate(*args)
            finally:
                self.seconds[key] = time.monotonic() - start

        self._futures = {key: self._pool.submit(run, key, args) for key, args in cases.items()}

    def __getitem__(self, key):
        return self._futures[key].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def relu_problem() -> Path:
    return CANDIDATES / "relu_problem.py"


@pytest.fixture
def fast_config():
    """Full checks with a short timing loop: the CPU timings mean nothing anyway."""
    from kernelagent.harness import EvalConfig, StageTimeouts

    return EvalConfig(trials=3, target_ms=20, warmup_ms=5, max_reps=20,
                      timeouts=StageTimeouts(start=60, load=30, compile=60, correctness=60, timing=60))

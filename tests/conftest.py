"""Shared fixtures. The harness fixtures start one harness server per test session: each
evaluation still runs in fresh processes, but the server's imports are paid once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
CANDIDATES = TESTS / "candidates"
BENCHMARKS = REPO / "benchmarks"

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


@pytest.fixture
def relu_problem() -> Path:
    return CANDIDATES / "relu_problem.py"


@pytest.fixture
def fast_config():
    """Full checks with a short timing loop: the CPU timings mean nothing anyway."""
    from kernelagent.harness import EvalConfig, StageTimeouts

    return EvalConfig(trials=3, target_ms=20, warmup_ms=5, max_reps=20,
                      timeouts=StageTimeouts(start=60, load=30, compile=60, correctness=60, timing=60))

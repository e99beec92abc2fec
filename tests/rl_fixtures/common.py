"""Shared by the RL tests: one CPU evaluator pool for the whole session (created on first use,
closed at exit), the known candidates, and the scripted `optimize` runs recorded under recorded/
for the export tests (re-record with `python -m tests.rl_fixtures.record_runs`)."""

from __future__ import annotations

import atexit
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import BENCHMARKS, CANDIDATES, read

RELU_PROBLEM = CANDIDATES / "relu_problem.py"
GOOD = read(CANDIDATES / "relu_good.py")
GOOD_B = GOOD.replace("1024),)](x, y, n, BLOCK=1024)", "512),)](x, y, n, BLOCK=512)")
WRONG = read(CANDIDATES / "relu_wrong.py")
SYNTAX = read(CANDIDATES / "syntax_error.py")
MUTATES = read(CANDIDATES / "mutates_input.py")
assert GOOD_B != GOOD

_lock = threading.Lock()
_pool = None


def fast_config():
    from kernelagent.harness import EvalConfig, StageTimeouts

    return EvalConfig(trials=2, target_ms=10, warmup_ms=2, max_reps=10,
                      timeouts=StageTimeouts(start=60, load=30, compile=60, correctness=60, timing=60))


def shared_pool():
    """Two CPU evaluators shared by every RL test module."""
    global _pool
    with _lock:
        if _pool is None:
            import tempfile

            from kernelagent.harness.caller.pool import EvaluatorPool

            _pool = EvaluatorPool(devices=["cpu", "cpu"],
                                  cache_dir=tempfile.mkdtemp(prefix="kernelagent-rl-cache-"))
            atexit.register(_pool.close)
        return _pool


def block(code: str, prose: str) -> str:
    return f"{prose}\n\n```python\n{code}```\n"


# (run name, problem file, replies): text-mode runs. Reasoning lengths differ on purpose.
LONG = ("I will write an elementwise kernel. Each program handles one block of 1024 "
        "elements, masks the tail, loads x, applies max(x, 0) and stores the result. "
        "This is memory bound, so one pass over the data is the best we can do.")
SHORT = "Elementwise max(x, 0), one pass, masked tail."
MEDIUM = "A first try, then a fix: max(x, 0) per element with blocks of 512, masked tail."
RUNS = [
    ("a_long", RELU_PROBLEM, [block(GOOD, LONG)]),
    ("b_short", RELU_PROBLEM, [block(GOOD, SHORT)]),  # same kernel as a_long, more concise
    ("c_fix", RELU_PROBLEM, [block(WRONG, "Try a leaky variant."), block(GOOD_B, MEDIUM)]),
    ("d_fail", RELU_PROBLEM, [block(WRONG, "Leaky."), block(SYNTAX, "Oops.")]),
    ("e_other", BENCHMARKS / "level1" / "1_relu.py", [block(GOOD, SHORT)]),
]

_runs: dict[str, Path] = {}
FIXTURE_RUNS = Path(__file__).resolve().parent / "recorded"  # recorded by record_runs.py


def recorded_runs(root: Path) -> dict[str, Path]:
    """Run `optimize` (text mode, scripted replies, shared CPU pool) once per session."""
    from kernelagent.orchestrate import optimize
    from kernelagent.models import ScriptedModel

    with _lock:
        if _runs:
            return dict(_runs)
    pool = shared_pool()

    def one(spec):
        name, problem, replies = spec
        out = root / name
        optimize(problem, ScriptedModel(list(replies), name="scripted-teacher"), mode="text",
                 max_turns=3, out=out, evaluator=pool, trials=2, quick_trials=2,
                 eval_overrides={"target_ms": 10, "warmup_ms": 2, "max_reps": 10})
        return name, out

    with ThreadPoolExecutor(max_workers=3) as ex:
        results = dict(ex.map(one, RUNS))
    with _lock:
        _runs.update(results)
    return dict(_runs)

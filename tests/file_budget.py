"""A time budget for each GPU test file (issue 25, scope 3): the whole GPU suite runs in one
device call, and one file that hangs must not spend that call and hide the files after it.

Every test marked `gpu` counts its setup, call and teardown against its file's budget
(FILE_BUDGETS_S, else DEFAULT_BUDGET_S). When the budget runs out mid-test, SIGALRM interrupts
it with FileBudgetSpent, which names the file, the test and the budget; the file's later tests
end at once the same way, and the next file starts with its own budget. A number in
KERNELAGENT_GPU_FILE_BUDGET_S replaces every budget (0 turns them off).

Registered by tests/conftest.py. Where pytest-timeout is installed and on for a test, it owns
SIGALRM and this plugin stands aside for that test (the device machine has no pytest-timeout;
CI runs no GPU test).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

DEFAULT_BUDGET_S = 150.0
# From the H200 suite run of 2026-11-26 (454.5 s in all, jobs of several files overlapping in one
# server): about twice what each file took, and well under the device call's 540 s.
FILE_BUDGETS_S = {
    "test_kernelbench_solutions.py": 240.0,
    "test_harness_gpu.py": 200.0,
    "test_adversarial_gpu.py": 180.0,
    "test_cuda_gpu.py": 180.0,
    "test_trace_attacks_gpu.py": 300.0,  # not yet run: ten candidates at once, one with a CPU round trip per call
}
ENV = "KERNELAGENT_GPU_FILE_BUDGET_S"

_spent: dict[str, float] = {}
SPENT = pytest.StashKey[str]()


class FileBudgetSpent(Exception):
    """A GPU test file ran past its budget."""


def budget_for(name: str) -> float:
    raw = os.environ.get(ENV, "").strip()
    if raw:
        return max(float(raw), 0.0)
    return FILE_BUDGETS_S.get(name, DEFAULT_BUDGET_S)


def _timeout_plugin_on(item: pytest.Item) -> bool:
    if not item.config.pluginmanager.hasplugin("timeout"):
        return False
    marker = item.get_closest_marker("timeout")
    value = marker.args[0] if marker is not None and marker.args else item.config.getoption("timeout", None)
    if value is None:
        value = item.config.getini("timeout")
    try:
        return float(value or 0) > 0
    except (TypeError, ValueError):
        return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if (item.get_closest_marker("gpu") is None or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread() or _timeout_plugin_on(item)):
        yield
        return
    name = item.path.name
    budget = budget_for(name)
    if budget <= 0:
        yield
        return
    left = budget - _spent.get(name, 0.0)
    if left <= 0:
        item.stash[SPENT] = (f"{name} spent its {budget:.0f} s budget ({ENV}) before {item.name}: "
                             "not run; the next file starts with its own budget")
        yield
        return

    def expire(signum, frame):
        raise FileBudgetSpent(f"{name} ran past its {budget:.0f} s budget ({ENV}) in {item.name}: "
                              "its remaining tests are not run, and the next file starts with its own budget")

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _spent[name] = _spent.get(name, 0.0) + time.monotonic() - started


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test of a file whose budget is spent ends before its setup, as an error that says so."""
    why = item.stash.get(SPENT, None)
    if why is not None:
        raise FileBudgetSpent(why)

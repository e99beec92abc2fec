"""Forking job processes from a multi-threaded server (server/forking.py).

A fork copies one thread: a module another thread was importing at that moment stays locked in
the child for ever. On an H100 the later jobs of a cold wave of 8 lost their whole 'start' limit
that way (the memory estimate's helper hung to its timeout). These tests show the hazard with a
real fork, and that the server's guards (everything of ours imported up front, and each fork
waiting for other threads' imports) keep a child from it.
"""

from __future__ import annotations

import ast
import builtins
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelagent.harness.server import forking, memory

ROOT = Path(__file__).resolve().parents[1]


def _lazy_imports() -> set[str]:
    """Modules of ours imported inside a function of the server's or the children's modules."""
    found = set()
    for folder in ("server", "child"):
        for path in sorted((ROOT / "kernelagent" / "harness" / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("kernelagent"):
                        for alias in sub.names:
                            full = f"{sub.module}.{alias.name}"
                            base = ROOT / Path(*full.split("."))
                            found.add(full if base.with_suffix(".py").is_file() or base.is_dir() else sub.module)
                    elif isinstance(sub, ast.Import):
                        found.update(a.name for a in sub.names if a.name.startswith("kernelagent"))
    return found


def test_every_lazy_import_of_ours_is_preloaded():
    missing = _lazy_imports() - set(forking.PRELOAD)
    assert not missing, f"imported lazily by a job's thread or child, not in forking.PRELOAD: {sorted(missing)}"
    assert forking.preload() == []
    assert all(name in sys.modules for name in forking.PRELOAD)


@pytest.fixture
def slow_module(tmp_path, monkeypatch):
    """A module whose import blocks until the returned event is set."""
    name = f"ka_slow_import_{os.getpid()}_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text("import builtins\nbuiltins._ka_slow_import.wait(10)\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    event = threading.Event()
    monkeypatch.setattr(builtins, "_ka_slow_import", event, raising=False)
    yield name, event
    event.set()
    sys.modules.pop(name, None)


def _child_imports(name: str) -> int:
    """Fork; the child imports `name` and exits 0. Returns the child's pid."""
    pid = os.fork()
    if pid == 0:  # the child: one thread, whatever the parent's others held
        try:
            __import__(name)
            os._exit(0)
        finally:
            os._exit(1)
    return pid


def _exited_within(pid: int, seconds: float) -> int | None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    return None


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads: the very hazard shown
def test_a_fork_mid_import_hangs_the_child_and_the_guard_waits_it_out(slow_module):
    name, event = slow_module
    importer = threading.Thread(target=__import__, args=(name,), daemon=True)
    importer.start()
    for _ in range(500):
        if name in forking.importing_threads():
            break
        time.sleep(0.01)
    assert name in forking.importing_threads()
    # The hazard: a child forked now never finishes the import its parent's other thread began.
    stuck = _child_imports(name)
    try:
        assert _exited_within(stuck, 1.0) is None
    finally:
        os.kill(stuck, 9)
        os.waitpid(stuck, 0)
    # The guard: bounded when the import goes on...
    assert 0.2 <= forking.quiet_imports(timeout_s=0.2) < 2.0
    # ...and done as soon as it ends; a child forked then imports at once.
    threading.Timer(0.3, event.set).start()
    waited = forking.quiet_imports(timeout_s=5.0)
    assert 0.2 <= waited < 4.0 and forking.importing_threads() == []
    importer.join(5)
    child = _child_imports(name)
    assert _exited_within(child, 5.0) == 0


class _Job:
    """What server/memory.py's Memory reads of a job here (seams.MemoryJob): its problem, gate
    and clock."""

    def __init__(self, tmp_path, estimates):
        self.problem_source = "import torch\n"
        self.root = tmp_path
        self.gate = type("G", (), {"estimates": estimates})()
        self.gate_memory = None
        self.concurrency = {}
        self.paused = 0

    def pause_clock(self, paused: bool) -> None:
        self.paused += 1 if paused else -1


@pytest.mark.parametrize("answer, cached", [
    ({"input_bytes": 1}, True),
    ({"error": "the problem cannot be built on the meta device"}, True),
    ({"error": "estimating the problem's memory took more than 20 s", "helper_failed": True}, False),
    ({"error": "the process estimating the problem's memory died", "helper_failed": True}, False),
])
def test_the_memory_estimate_runs_on_a_paused_clock_and_a_hung_helper_is_tried_again(tmp_path, monkeypatch,
                                                                                       answer, cached):
    seen = []

    def estimate(source, workdir, timeout):
        seen.append((job.paused, timeout))
        return dict(answer)

    monkeypatch.setattr(memory, "forked_device_estimate", estimate)
    estimates: dict = {}
    job = _Job(tmp_path, estimates)
    memory.Memory(job).reserve_device_memory()
    assert seen == [(1, memory.ESTIMATE_TIMEOUT_S)] and job.paused == 0  # paused throughout, then resumed
    assert job.concurrency["estimate_s"] >= 0
    assert ("estimate_error" in job.concurrency) == ("error" in answer)
    assert bool(estimates) == cached
    memory.Memory(_Job(tmp_path, estimates)).reserve_device_memory()
    assert len(seen) == (1 if cached else 2)


def test_a_forked_helper_that_hangs_or_dies_says_so_and_an_answer_cannot_claim_it(tmp_path):
    """processes._in_fork marks its own failures (HELPER_FAILED), which server/memory.py does not
    cache; an answer from the helper never carries the mark (problem code runs there)."""
    from kernelagent.harness.server import processes

    hung = processes._in_fork(lambda: time.sleep(30), tmp_path, 0.5, "sleeping")
    assert hung == {"error": "sleeping took more than 0 s", processes.HELPER_FAILED: True}
    died = processes._in_fork(lambda: os._exit(3), tmp_path, 10.0, "exiting")
    assert died == {"error": "the process exiting died", processes.HELPER_FAILED: True}
    said = processes._in_fork(lambda: {"error": "cannot build", processes.HELPER_FAILED: True}, tmp_path, 10.0, "x")
    assert said == {"error": "cannot build"}

"""Forking job processes from a server whose other threads are busy.

The server runs each job in a thread of its own, and every job forks: its reference and candidate
processes, and a short-lived helper for the memory plan's estimate (processes._in_fork). A fork
copies one thread. A module that another thread was importing at that moment stays locked in the
child for ever (importlib's per-module lock, owned by a thread the child does not have), and the
child's first import of it never returns.

A wave of cold evaluations hung this way: the estimate's helper used up its timeout, and the
job's own processes, forked only then, were caught at the 'start' limit before their first line
(docs/concepts/timing.md, "The cold wave that used to hang, measured fixed", and
docs/concepts/concurrency.md, "Measurements behind the code"). So:

- `preload()`, at the server's start before any job thread exists, imports every module of ours
  that a job's thread or a forked child imports lazily (PRELOAD; tests/test_forking.py holds the
  list against the code), so no job thread is ever mid-import of one;
- `quiet_imports()`, just before each fork, waits (briefly, bounded) until no other thread holds
  a module lock, for the imports that are not ours (torch's own lazy imports, a problem's).
"""

from __future__ import annotations

import importlib
import threading
import time

# Modules a job's thread in the server or a child forked from it imports inside a function. Every
# one is imported once by preload(); tests/test_forking.py fails when a lazy import is missing here.
PRELOAD = (
    "kernelagent.errors",
    "kernelagent.hardware",
    "kernelagent.harness.child.candidate_side",
    "kernelagent.harness.child.common",
    "kernelagent.harness.child.compare",
    "kernelagent.harness.child.cuda_build",
    "kernelagent.harness.child.defences",
    "kernelagent.harness.child.inputs",
    "kernelagent.harness.child.memory_plan",
    "kernelagent.harness.child.persisting_l2",
    "kernelagent.harness.child.reference_side",
    "kernelagent.harness.child.sm_clocks",
    "kernelagent.harness.child.timing",
    "kernelagent.harness.child.transfer",
    "kernelagent.harness.child.triton_warm",
    "kernelagent.harness.config",
    "kernelagent.harness.cuda_source",
    "kernelagent.harness.derive",
    "kernelagent.harness.interpreter",
    "kernelagent.harness.jail.candidate",
    "kernelagent.harness.jail.fds",
    "kernelagent.harness.jail.namespaces",
    "kernelagent.harness.jail.probe",
    "kernelagent.harness.jail.sandbox",
    "kernelagent.harness.literal_shapes",
    "kernelagent.harness.private_dir",
    "kernelagent.harness.procname",
    "kernelagent.harness.result",
    "kernelagent.harness.server.audit",
    "kernelagent.harness.server.build_cache",
    "kernelagent.harness.server.device_lock",
    "kernelagent.harness.server.evidence",
    "kernelagent.harness.server.forking",
    "kernelagent.harness.server.kernel_evidence",
    "kernelagent.harness.server.listen",
    "kernelagent.harness.server.ncu",
    "kernelagent.harness.server.ncu_session",
    "kernelagent.harness.server.precompile",
    "kernelagent.harness.server.processes",
    "kernelagent.harness.server.profilers",
    "kernelagent.harness.server.tool_jail",
    "kernelagent.harness.trace.baseline_clock",
    "kernelagent.harness.trace.build",
    "kernelagent.harness.trace.calls",
    "kernelagent.harness.trace.channel",
    "kernelagent.harness.trace.marks",
    "kernelagent.harness.trace.records",
    "kernelagent.harness.trace.rules",
)

QUIET_WAIT_S = 5.0  # the longest a fork waits for another thread's import to finish


def preload() -> list[str]:
    """Import PRELOAD; returns what failed to import, 'module: error' each (a server still
    serves: that module is then imported where it is used, as before)."""
    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - an optional dependency missing, say
            failed.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
    return failed


def importing_threads() -> list[str]:
    """Modules whose import another thread of this process is in the middle of (their lock is
    held by a thread other than the caller)."""
    try:
        from importlib import _bootstrap
    except ImportError:
        return []
    me = threading.get_ident()
    busy = []
    for name, ref in list(getattr(_bootstrap, "_module_locks", {}).items()):
        lock = ref() if callable(ref) else None
        owner = getattr(lock, "owner", None)
        if owner is not None and owner != me:
            busy.append(name)
    return busy


def quiet_imports(timeout_s: float = QUIET_WAIT_S) -> float:
    """Wait until no other thread is importing a module, at most `timeout_s`; the seconds waited
    (a job records them: `concurrency.fork_wait_s`)."""
    started = time.monotonic()
    pause = 0.001
    while importing_threads():
        if time.monotonic() - started >= timeout_s:
            break
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return time.monotonic() - started

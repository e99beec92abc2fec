"""The tracer's markers and flushes, called by OUR harness code inside the candidate's and the
reference's processes (issue 55), through ctypes on the library the CUDA driver already loaded.

The tracer (tracer.c) is loaded by the driver at cuInit from CUDA_INJECTION64_PATH and unsets
that variable; `attach()` finds the loaded copy by its soname with RTLD_NOLOAD, so it never loads
a second one and, where no tracer was injected (the CPU, a tracer that could not be built),
every call is a no-op that says why. Nothing here is evidence by itself: the markers are only
worth what the server reads from the trace's channel.

Markers: `mark(stream=, phase=, index=, end=)` launches `kernelagent_trace_marker` with grid
(index+1, phase, 1) before a call and (index+1, phase, 2) after it, on `stream` (a CUstream
handle: torch.cuda.current_stream().cuda_stream). Each call's begin marker goes before its start
event and its end marker after its end event, so a marker never counts in a timed call."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

SONAME = "libkernelagent_trace.so"

FIRST, CHECK, TIMED, WARMUP = 1, 2, 3, 4
PHASES = {"first": FIRST, "check": CHECK, "timed": TIMED, "warmup": WARMUP}
# The reference's baselines (issue 58, trace/baseline_clock.py): the timed calls of runner r (its
# place in `runner_names`, the order the server knows from the modes it sent) carry phase
# BASELINE + r, numbered from 0; after the last runner the reference flushes with BASELINE_FLUSH.
BASELINE, BASELINE_RUNNERS, BASELINE_FLUSH = 16, 16, 3


def runner_names(compile_modes: list[str]) -> list[str]:
    """The baselines' names in the order their phases are given: eager, then each compile mode as
    the server sent them ("compile" for "default", else "compile:<mode>")."""
    from kernelagent.harness.config import baseline_name

    return (["eager"] + [baseline_name(mode) for mode in compile_modes])[:BASELINE_RUNNERS]


def baseline_phase(name: str, compile_modes: list[str]) -> int | None:
    """The marker phase of baseline `name`'s timed calls, None for one past BASELINE_RUNNERS."""
    names = runner_names(compile_modes)
    return BASELINE + names.index(name) if name in names else None


@dataclass
class Marks:
    """The in-process handle; `available` False means every call is a no-op (see `reason`)."""
    lib: ctypes.CDLL | None = None
    reason: str = ""
    errors: list[int] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return self.lib is not None

    def mark(self, *, stream: int, phase: int, index: int, end: bool) -> int:
        """Launch one marker; 0 when launched, else the tracer's code (kept in `errors`)."""
        if self.lib is None:
            return -1
        code = int(self.lib.kernelagent_trace_mark(ctypes.c_uint64(int(stream) & (2**64 - 1)),
                                                   ctypes.c_uint(phase), ctypes.c_uint(index),
                                                   ctypes.c_int(1 if end else 0)))
        if code and len(self.errors) < 16:
            self.errors.append(code)
        return code

    def flush(self, *, mark: int = 0, final: bool) -> int:
        """Synchronise, deliver every record, then write the `flush` record (final: the last)."""
        if self.lib is None:
            return -1
        return int(self.lib.kernelagent_trace_flush(ctypes.c_uint(mark), ctypes.c_int(1 if final else 0)))

    def counts(self) -> tuple[int, int]:
        """(records written, records dropped) so far, as the tracer counts them."""
        if self.lib is None:
            return (0, 0)
        written, dropped = ctypes.c_uint64(0), ctypes.c_uint64(0)
        self.lib.kernelagent_trace_counts(ctypes.byref(written), ctypes.byref(dropped))
        return (written.value, dropped.value)


ENV_VARS = ("CUDA_INJECTION64_PATH", "KERNELAGENT_TRACE_FD")


def attach(name: str = SONAME) -> Marks:
    """The tracer the driver loaded into this process, or a no-op handle with the reason. Call
    after CUDA is initialised (the driver loads the tracer at cuInit). The tracer unset its
    variables in the C environment; Python's os.environ is a copy taken at start, so they are
    dropped here too, or a process started through subprocess would get them back (seen on the
    H200: os.environ still held both after the injection)."""
    for var in ENV_VARS:
        os.environ.pop(var, None)
    try:
        lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return Marks(reason="no tracer in this process (not injected, or CUDA not initialised yet)")
    try:
        lib.kernelagent_trace_mark.restype = ctypes.c_int
        lib.kernelagent_trace_mark.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_uint, ctypes.c_int]
        lib.kernelagent_trace_flush.restype = ctypes.c_int
        lib.kernelagent_trace_flush.argtypes = [ctypes.c_uint, ctypes.c_int]
        lib.kernelagent_trace_counts.restype = None
        lib.kernelagent_trace_counts.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
    except AttributeError as exc:
        return Marks(reason=f"the loaded {name} is not our tracer: {exc}")
    return Marks(lib=lib)

"""The trace's channel (issue 55): the server's end (a pipe made before the job's processes are
forked, read by a bounded thread) and the child's end (what a forked job process does with it
before any code of the job runs).

Server: `open_channel()` makes the pipe; after the fork, `Channel.start()` closes the server's
copy of the write end and reads the read end in a thread into a buffer of at most `cap_bytes`
(past it the bytes are read and dropped, and `overflow` is set: the trace is then incomplete and
the evidence falls back to Nsight Compute); `Channel.collect()` stops the reader (at the writer's
end of file, or after a short drain once the job's processes are gone) and returns the bytes.

Child (`prepare_child`, first thing after the fork, before the jail and before CUDA starts):
the tracer is loaded by its path (so the driver's dlopen of the same path at cuInit finds it
loaded, whatever the jail hides of the cache it lies in), and CUDA_INJECTION64_PATH and
KERNELAGENT_TRACE_FD are set for the driver to read at cuInit. The descriptor to keep is returned
for the jail's and child_setup's keep lists. A process given no channel writes to /dev/null (the
reference has its own channel since issue 58: its baselines' device times)."""

from __future__ import annotations

import ctypes
import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any

CAP_BYTES = 64 << 20  # the spec's bound: a trace past it is `trace-overflow` (incomplete)
READ_CHUNK = 1 << 16
ENV_LIB, ENV_FD = "CUDA_INJECTION64_PATH", "KERNELAGENT_TRACE_FD"


@dataclass
class TraceBytes:
    data: bytes
    overflow: bool          # more than cap_bytes came: the trace is incomplete
    ended: bool             # the writer closed its end (every process holding it is gone)
    read_bytes: int         # all bytes read, kept or not


@dataclass
class Channel:
    """The server's side of one process's trace channel."""
    read_fd: int
    write_fd: int
    cap_bytes: int = CAP_BYTES
    _buf: bytearray = field(default_factory=bytearray)
    _read: int = 0
    _overflow: bool = False
    _ended: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def child_spec(self, library: str) -> dict[str, Any]:
        """What the forked process needs (job dict's "trace"): the library and the fd number."""
        return {"library": str(library), "fd": self.write_fd}

    def start(self) -> None:
        """The reader thread (before or after the fork: the server's copy of the write end is
        closed by `collect`, after which EOF means every writer is gone)."""
        self._thread = threading.Thread(target=self._run, name="kernelagent-trace-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._drain()
        finally:  # the reader alone closes what it reads (collect, close): never under it
            _close(self.read_fd)
            self.read_fd = -1

    def _drain(self) -> None:
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        while True:
            try:
                ready = poller.poll(50)
            except OSError:
                self._ended = True
                return
            if not ready:
                if self._stop.is_set():
                    return
                continue
            try:
                data = os.read(self.read_fd, READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                self._ended = True
                return
            if not data:
                self._ended = True
                return
            self._read += len(data)
            room = self.cap_bytes - len(self._buf)
            if room > 0:
                self._buf += data[:room]
            if len(data) > max(room, 0):
                self._overflow = True

    def collect(self, drain_s: float = 0.5) -> TraceBytes:
        """Stop reading (after the writer's end, or `drain_s` of quiet once asked) and return what
        came. Call once the job's processes are gone or have flushed their final record."""
        _close(self.write_fd)
        self.write_fd = -1
        if self._thread is not None:
            self._thread.join(timeout=drain_s)
            self._stop.set()
            self._thread.join(timeout=5.0)  # it closes the read end as it stops
        else:
            _close(self.read_fd)
            self.read_fd = -1
        return TraceBytes(data=bytes(self._buf), overflow=self._overflow, ended=self._ended,
                          read_bytes=self._read)

    def snapshot(self) -> tuple[bytes, bool]:
        """(what came so far, whether the reader stopped: the writer's end, an error, or past
        the cap) without stopping the reader (the reference's trace, read after its baselines
        while the process runs on: server/trace_stage.baseline_clock)."""
        return bytes(self._buf), self._ended or self._overflow

    def close(self) -> None:
        """Give both ends back without reading (a job that never forked). A reader running closes
        the read end itself as it stops (within its 50 ms poll): closed under it, the number could
        go to another job's pipe before its next read, which would then read that job's trace."""
        self._stop.set()
        _close(self.write_fd)
        self.write_fd = -1
        if self._thread is None:
            _close(self.read_fd)
            self.read_fd = -1


def open_channel(cap_bytes: int = CAP_BYTES) -> Channel:
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        import fcntl

        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, 1 << 20)  # room before a record could be dropped
    except (OSError, AttributeError):
        pass
    return Channel(read_fd=read_fd, write_fd=write_fd, cap_bytes=cap_bytes)


def _close(fd: int) -> None:
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


# --------------------------------------------------------------------------------------
# The child's side
# --------------------------------------------------------------------------------------

def prepare_child(spec: dict[str, Any] | None) -> list[int]:
    """In a forked job process, before its jail and before CUDA starts: load the tracer and set
    the variables the driver reads at cuInit. Returns the descriptors to keep (the channel's, or
    a /dev/null one when the spec names no fd). Without a spec nothing happens (no tracer: the
    CPU, or a tracer that could not be built) and [] is returned. Our variables replace any of
    the same name the server inherited (a profiler's injection library)."""
    if not spec or not spec.get("library"):
        return []  # no tracer of ours: the process's environment is left as it is
    library = str(spec["library"])
    fd = spec.get("fd")
    if not isinstance(fd, int) or fd < 0:
        fd = os.open(os.devnull, os.O_WRONLY)
    # The tracer's own load, by the path the driver will dlopen: then the driver finds it loaded
    # (glibc matches the name), in a jail that hides the cache it lies in.
    ctypes.CDLL(library, mode=os.RTLD_NOW)
    os.environ[ENV_LIB] = library
    os.environ[ENV_FD] = str(fd)
    return [fd]


def forget_env() -> None:
    """Once CUDA has started in a traced process: its variables out of Python's environment too
    (the tracer unset them in the C environment; os.environ is Python's copy, which subprocess and
    Inductor's compile workers would pass on, each with a descriptor number of no meaning to it)."""
    os.environ.pop(ENV_LIB, None)
    os.environ.pop(ENV_FD, None)


def wait_for_end(ch: Channel, timeout_s: float) -> bool:
    """True once the channel's writer has closed (tests, probes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ch._ended:
            return True
        time.sleep(0.01)
    return ch._ended

"""An Nsight Compute session as a process (server/ncu.py starts it): read by a thread, the
READY/GO handshake that lets the harness server hold the device's timing slot for the candidate's
part (two phases for an early session: warm-up with the others running, profiled calls with them
stopped), its CPU through wait4, and the host's one-profiling-session lock."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from kernelagent import settings
from kernelagent.harness.child.ncu_entry import GO_FILE  # stdlib-only at import: cheap


# The longest the candidate's part of an ncu session (import, warm-up, profiled calls) may hold
# the device's timing slot: neighbours' timed loops wait meanwhile (their clocks paused).
PROFILED_HOLD_S = 60.0


def kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.kill()


def reap(proc: subprocess.Popen, timeout: float) -> float | None:
    """proc.wait(timeout) that also says how much CPU the process and everything it reaped used
    (os.wait4's rusage: ncu, the jail, the interpreter under it); None where someone else reaped
    it. subprocess.TimeoutExpired as proc.wait."""
    deadline = time.monotonic() + max(0.0, timeout)
    pause = 0.002
    while proc.returncode is None:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            proc.poll()
            return None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(pause)
        pause = min(pause * 2, 0.01)  # the evidence's slot is held until this returns
    return None


def run_counted(argv: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    """subprocess.run(capture_output, text) with the CPU seconds it used."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out, err = proc.communicate(timeout=timeout)  # reads to EOF; the process may still be exiting
        cpu = reap(proc, 30) or 0.0
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), cpu


class NcuSession:
    """An ncu process in a session of its own (so one signal reaches ncu, the jail and the
    candidate's processes), its output read by a thread. Spawned at once; `run` waits for it.
    With `handshake`, the target (child/ncu_entry.py) says READY after our own set-up and waits
    for GO_FILE before any of the candidate's code runs: the server can start a session early
    (while the job's checks run: server/evidence.py) and let it go only holding the device."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str],
                 on_spawn: Callable[[int | None], None] | None = None, handshake: bool = False,
                 two_phase: bool = False):
        if handshake:
            env = dict(env, KERNELAGENT_NCU_HANDSHAKE="1")
        # two_phase: the target warms up after GO (the slot taken, the other jobs running on),
        # says WARMED and waits for GO2, which comes once the slot's holder has stopped the others
        # (gate.Hold.freeze): only the profiled calls and the end run with the device frozen.
        self.two_phase = bool(handshake and two_phase)
        if self.two_phase:
            env = dict(env, KERNELAGENT_NCU_TWO_PHASE="1")
        self.argv, self.cwd, self.on_spawn = argv, cwd, on_spawn
        self.spawned = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        if on_spawn is not None:
            on_spawn(self.proc.pid)
        self.lines: list[str] = []
        self.cpu_s = 0.0  # the session's CPU (ncu, the jail, the target), once it has ended
        self.ready = threading.Event()
        self.warmed = threading.Event()
        self.ready_at: float | None = None
        self.stamps: dict[str, float] = {}
        self._reader = threading.Thread(target=self._read, daemon=True, name="ncu-session-reader")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if len(self.lines) < 20_000:
                self.lines.append(line)
            if line.startswith("KERNELAGENT_NCU_READY") and not self.ready.is_set():
                self.ready_at = time.monotonic()
                self.ready.set()
            elif line.startswith("KERNELAGENT_NCU_WARMED"):
                self.warmed.set()  # the candidate's own word: forging it only moves its own freeze
            elif line.startswith("KERNELAGENT_NCU_T ") and len(self.stamps) < 8:
                _, name, value = (line.strip() + " - -").split(" ", 3)[:3]
                try:  # the target's own progress: informational only (the phases of the evidence)
                    self.stamps.setdefault(name[:20], float(value.split()[0]))
                except ValueError:
                    pass
        self.ready.set()
        self.warmed.set()

    def kill(self) -> None:
        kill_session(self.proc)
        self.proc.wait()
        if self.on_spawn is not None:
            self.on_spawn(None)
        self._reader.join(5)

    def run(self, timeout: float, on_ready: Callable[[], Any] | None = None) -> subprocess.CompletedProcess | None:
        """Wait for the session; None when it ran past `timeout` from now (then the whole session
        is killed). on_ready: a context manager factory (the server's timing slot) entered when
        the target says READY, before it is let go, and left when the whole session has ended
        (or after PROFILED_HOLD_S, when it is killed)."""
        proc = self.proc
        overheld = False
        called = time.monotonic()
        deadline = called + timeout
        phases: dict[str, float] = {}
        try:
            if on_ready is not None and self.ready.wait(max(0.0, deadline - time.monotonic())) \
                    and proc.poll() is None:
                remaining = max(0.0, deadline - time.monotonic())
                phases["to_ready_s"] = (self.ready_at or time.monotonic()) - self.spawned
                phases["ready_wait_s"] = max(0.0, (self.ready_at or called) - called)  # run() waited for READY
                waiting = time.monotonic()
                with on_ready() as hold:
                    # Waiting for the slot (and the host's ncu lock) is not the session's own time.
                    deadline = time.monotonic() + remaining
                    phases["slot_wait_s"] = time.monotonic() - waiting
                    going = time.monotonic()
                    (self.cwd / GO_FILE).touch()
                    if self.two_phase:
                        # Its warm-up with the others running on (no other job times meanwhile);
                        # then the others stopped and the device idle for the profiled calls.
                        self.warmed.wait(max(0.0, min(PROFILED_HOLD_S, deadline - time.monotonic())))
                        phases["warm_s"] = time.monotonic() - going
                        if hasattr(hold, "freeze"):
                            hold.freeze()
                        (self.cwd / (GO_FILE + "2")).touch()
                    # Held until the whole session has ended, never on a line the candidate could
                    # print itself: after it nothing of the session is left to put a kernel beside
                    # a neighbour's timed loop (the jail's pid namespace ends with it).
                    try:
                        self.cpu_s = reap(proc, min(PROFILED_HOLD_S, max(0.0, deadline - time.monotonic()))) or 0.0
                    except subprocess.TimeoutExpired:
                        kill_session(proc)  # it holds the device too long: no evidence, no win
                        proc.wait()
                        overheld = True
                    phases["profiled_s"] = time.monotonic() - going
                    for name, at in self.stamps.items():
                        phases[f"target_{name}_s"] = at - going
            self.cpu_s = reap(proc, max(0.0, deadline - time.monotonic())) or self.cpu_s
            phases["session_s"] = time.monotonic() - self.spawned
        except subprocess.TimeoutExpired:
            kill_session(proc)
            proc.wait()
            return None
        except BaseException:  # the slot could not be had (the server's bug, an interrupt): nothing outlives it
            kill_session(proc)
            proc.wait()
            raise
        finally:
            if self.on_spawn is not None:
                self.on_spawn(None)
            self._reader.join(5)
        if overheld:
            return None
        done = subprocess.CompletedProcess(self.argv, proc.returncode, "".join(self.lines), "")
        phases["cpu_s"] = self.cpu_s
        done.phases = {k: round(v, 3) for k, v in phases.items() if -1e4 < v < 1e4}  # type: ignore[attr-defined]
        return done


def run_session(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
                 on_spawn: Callable[[int | None], None] | None,
                 on_ready: Callable[[], Any] | None = None) -> subprocess.CompletedProcess | None:
    """subprocess.run of an NcuSession: see NcuSession.run."""
    return NcuSession(argv, cwd, env, on_spawn, handshake=on_ready is not None).run(timeout, on_ready)


def busy_report(wait_s: float) -> dict[str, str]:
    return {"unavailable": f"other Nsight Compute sessions held this host's profiler for {wait_s:.0f} s"}


class NcuBusy(Exception):
    """The host's ncu lock was not had within its wait."""


class NcuLockRefused(NcuBusy):
    """The lock's folder is not this user's alone (private_dir.NotPrivate): no session runs."""


def unavailable(exc: NcuBusy, wait_s: float) -> dict[str, str]:
    """What a session that could not have the lock reports."""
    if isinstance(exc, NcuLockRefused):
        return {"unavailable": f"the Nsight Compute lock was not used: {exc}"}
    return busy_report(wait_s)


def with_the_lock(on_ready: Callable[[], Any], wait_s: float, key: str | None = None) -> Callable[[], Any]:
    """on_ready's slot, entered after the ncu lock (never the slot first: a session that held
    the device slot while it waited for the lock would stop every other job meanwhile); `key`:
    see ncu_lock."""

    @contextlib.contextmanager
    def slot() -> Iterator[None]:
        with ncu_lock(wait_s, key) as held:
            if not held:
                raise NcuBusy(wait_s)
            with on_ready() as hold:
                yield hold

    return slot


LOCK_SCOPES: tuple[str, ...] = settings.BY_NAME["KERNELAGENT_NCU_LOCK"].choices or ()


def lock_scope() -> str:
    """How far the profiled part of a harness server's Nsight Compute session (the kernel
    evidence) excludes the others: `$KERNELAGENT_NCU_LOCK`, "device" (the default: one at a time
    on each device, so the servers of several GPUs profile at once) or "host" (one at a time on
    the host). Anything else is a ValueError that names the variable (the caller checks it
    before a server starts: Evaluator._server_env)."""
    return settings.get("KERNELAGENT_NCU_LOCK")


def ncu_lock_dir() -> Path:
    """The folder of the Nsight Compute lock files: `$KERNELAGENT_NCU_LOCK_DIR`, else this
    user's private folder in the temp directory (private_dir.default_user_dir), made 0700 where
    missing. Either is used only while it is a directory of this user's that no one else may
    write to (never straight in a sticky /tmp, where another user could make the lock file
    first, or plant a link): else private_dir.NotPrivate. A harness server's temp directory is
    its own scratch root, so the caller names its folder there (Evaluator._server_env): the
    servers of every device and the caller's own sessions (`profile`) see the same files."""
    from kernelagent.harness import private_dir

    named = settings.get("KERNELAGENT_NCU_LOCK_DIR")
    return private_dir.make(named if named is not None else private_dir.default_user_dir())


_FRESH: list[Path] = []


def lock_dir_for_servers() -> Path:
    """ncu_lock_dir(), as the caller hands it to its servers. Where the usual folder in the temp
    directory is not this user's alone (another user made it first), a fresh private folder of
    this process's instead (its servers still share it), and the log says why; a folder the
    user named (`$KERNELAGENT_NCU_LOCK_DIR`) that is not private is a UserError (one line)."""
    from kernelagent.errors import UserError
    from kernelagent.harness import private_dir

    try:
        return ncu_lock_dir()
    except private_dir.NotPrivate as exc:
        if settings.get("KERNELAGENT_NCU_LOCK_DIR") is not None:
            raise UserError(f"KERNELAGENT_NCU_LOCK_DIR: {exc}") from None
        if not _FRESH:
            _FRESH.append(private_dir.fresh())
            import logging

            logging.getLogger(__name__).warning("Nsight Compute locks: %s; using %s instead", exc, _FRESH[0])
        return _FRESH[0]


def ncu_lock_path() -> Path:
    """The host-wide lock file of Nsight Compute sessions, in ncu_lock_dir()."""
    return ncu_lock_dir() / f"kernelagent-ncu-{os.getuid()}.lock"


def device_lock_path(key: str) -> Path:
    """The lock file of one device's sessions, beside the host's."""
    import hashlib

    host = ncu_lock_path()
    return host.with_name(f"{host.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}{host.suffix}")


@contextlib.contextmanager
def ncu_lock(wait_s: float, key: str | None = None) -> Iterator[bool]:
    """This host's Nsight Compute lock (flocks on files in the temp directory, outside every
    jail); yields False when it could not be had within `wait_s`. Without `key`: the host's lock,
    exclusive (one session on the host). With a device's `key`: the host's lock shared and that
    device's exclusive, so sessions on different devices profile at once while a host-wide
    session (no key) still waits for all of them, and they for it."""
    import fcntl

    from kernelagent.harness import private_dir

    try:
        wanted = [(ncu_lock_path(), fcntl.LOCK_EX)] if key is None else \
            [(ncu_lock_path(), fcntl.LOCK_SH), (device_lock_path(key), fcntl.LOCK_EX)]
    except private_dir.NotPrivate as exc:
        raise NcuLockRefused(str(exc)) from None
    fds: list[int] = []
    try:
        for path, _ in wanted:  # in our own folder; never through a link
            fds.append(os.open(str(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        raise NcuLockRefused(f"{exc.filename}: {exc.strerror or exc}") from None
    locked: list[int] = []
    try:
        until = time.monotonic() + max(0.0, wait_s)
        while len(locked) < len(fds):
            i = len(locked)
            try:
                fcntl.flock(fds[i], wanted[i][1] | fcntl.LOCK_NB)
                locked.append(fds[i])
            except BlockingIOError:
                if time.monotonic() >= until:
                    yield False
                    return
                time.sleep(0.1)
        yield True
    finally:
        for fd in reversed(locked):
            fcntl.flock(fd, fcntl.LOCK_UN)
        for fd in fds:
            os.close(fd)

"""One harness at a time on a GPU of this host: a lock file per device, shared by every harness
server of every user, held while a server has jobs on that device.

Within one server the gate (server/gate.py) keeps each timed loop alone on the device: every other
job is stopped and the device probed idle. Another server on the same GPU (a second
`kernelagent eval` in another terminal, a benchmark's fresh processes, another user's daemon) is
outside that gate: its checks and loops would run beside ours and stretch our times, and ours
theirs. So a server takes its device's lock when its first job is admitted and lets it go when
its last job ends (Admission, server/admission.py); a second server waits at admission, its jobs not
yet started and their clocks not running, while its own start (imports, probe) overlaps the
first server's work.

`flock` on `<dir>/<device key>.lock`: the kernel drops the lock with the last descriptor, so a
server that dies leaves nothing held. The directory is `$KERNELAGENT_DEVICE_LOCK_DIR`, else
`/tmp/kernelagent-device-locks` (sticky and world-writable, as /tmp, so that servers of
different users see one lock). The wait is bounded (`$KERNELAGENT_DEVICE_LOCK_WAIT_S`, default
600 s): a holder that never lets go (another user's idle daemon, or a hostile local user) costs
at most that, after which the jobs run and their results say so (`concurrency.device_lock`);
the gate's idle probe still flags a device kept busy through a timed loop (`device-busy`). Where
the lock cannot be opened at all (a file of another user's, not ours to open) the server runs
without it and says why. The descriptor is close-on-exec, and the job processes forked from the
server close every inherited descriptor (jail/fds.py), so no candidate can hold it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelagent import settings

if TYPE_CHECKING:
    from kernelagent.harness.server.record_types import DeviceLockInfo

DEFAULT_DIR = "/tmp/kernelagent-device-locks"
DEFAULT_WAIT_S: float = settings.BY_NAME["KERNELAGENT_DEVICE_LOCK_WAIT_S"].default
POLL_S = 0.05


def device_key(fingerprint: dict[str, Any]) -> str | None:
    """The device's identity on this host: its UUID, else its PCI bus id, where the probe read
    them (server/device_probe.py probe_timer), else the first visible device as the server sees it
    (CUDA_VISIBLE_DEVICES); None on the CPU."""
    if not fingerprint.get("cuda"):
        return None
    for name in ("uuid", "pci_bus_id"):
        value = fingerprint.get(name)
        if isinstance(value, str) and value.strip():
            return f"{name}:{value.strip().lower()}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return "visible:" + (visible or "0")


def lock_dir() -> Path:
    return settings.get("KERNELAGENT_DEVICE_LOCK_DIR") or Path(DEFAULT_DIR)


def wait_limit_s() -> float:
    try:
        value = float(settings.get("KERNELAGENT_DEVICE_LOCK_WAIT_S"))
    except ValueError:
        return DEFAULT_WAIT_S
    return value if 0 <= value < float("inf") else DEFAULT_WAIT_S


class DeviceLock:
    """The lock of one device. `acquire()` waits (bounded) and says what happened; `release()`
    lets go. Used by Admission under its own lock: one acquire per busy period of a server."""

    def __init__(self, key: str, directory: Path | None = None, wait_s: float | None = None):
        self.key = key
        self.directory = directory or lock_dir()
        self.wait_s = wait_limit_s() if wait_s is None else float(wait_s)
        self.path = self.directory / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".lock")
        self._fd: int | None = None
        self._mutex = threading.Lock()

    @classmethod
    def for_fingerprint(cls, fingerprint: dict[str, Any]) -> "DeviceLock | None":
        if not settings.get("KERNELAGENT_DEVICE_LOCK"):
            return None
        key = device_key(fingerprint)
        return cls(key) if key else None

    def _open(self) -> int:
        directory = self.directory
        try:
            directory.mkdir(mode=0o777, parents=True)
            os.chmod(directory, 0o1777)  # shared by every user's servers, like /tmp
        except FileExistsError:
            pass
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode):
            raise OSError(errno.ENOTDIR, f"{directory} is not a directory")
        if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
            raise OSError(errno.EPERM, f"{directory} is world-writable without the sticky bit")
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(self.path, flags, 0o666)
        except PermissionError:  # another user's file: a shared lock needs only a descriptor
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{self.path} is not a regular file")
        try:
            os.fchmod(fd, 0o666)  # ours: others may take it too (a no-op on another user's)
        except OSError:
            pass
        return fd

    def acquire(self) -> DeviceLockInfo:
        """{"device_lock": "held" | "timed out" | "unavailable: why", "device_lock_wait_s": s}."""
        started = time.monotonic()
        with self._mutex:
            if self._fd is not None:
                return {"device_lock": "held", "device_lock_wait_s": 0.0}
            try:
                fd = self._open()
            except OSError as exc:
                return {"device_lock": f"unavailable: {exc.strerror or exc}: {self.path}",
                        "device_lock_wait_s": 0.0}
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._fd = fd
                    return {"device_lock": "held", "device_lock_wait_s": round(time.monotonic() - started, 3)}
                except BlockingIOError:
                    pass
                except OSError as exc:
                    os.close(fd)
                    return {"device_lock": f"unavailable: {exc.strerror or exc}: {self.path}",
                            "device_lock_wait_s": round(time.monotonic() - started, 3)}
                if time.monotonic() - started >= self.wait_s:
                    os.close(fd)
                    return {"device_lock": f"timed out: another harness held {self.path} for {self.wait_s:.0f} s",
                            "device_lock_wait_s": round(time.monotonic() - started, 3)}
                time.sleep(POLL_S)

    def release(self) -> None:
        with self._mutex:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

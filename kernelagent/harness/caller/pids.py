"""Harness servers this side knows by pid alone: a warm harness it did not start (or started
detached), and a server a zygote forked once the zygote is gone. `PidProcess` is the little of
subprocess.Popen that the Evaluator uses (pid, poll, wait), by pid."""

from __future__ import annotations

import os
import time


def alive(pid: int) -> bool:
    """`pid` names a process (one of another user's too: signal 0 is refused, not unanswered)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PidProcess:
    """A process known by pid: running while the pid names one, then "ended" (0: its exit status
    belongs to its parent, not to us). A pid not known yet (None) is running until it is."""

    def __init__(self, pid: int | None):
        self.pid = pid if pid is not None else -1

    def poll(self) -> int | None:
        if self.pid <= 0:
            return None  # unknown yet (the hello says)
        return None if alive(self.pid) else 0

    def wait(self, timeout: float | None = None) -> int:
        until = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.poll() is None and time.monotonic() < until:
            time.sleep(0.05)
        return 0

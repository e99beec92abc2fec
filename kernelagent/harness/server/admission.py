"""How many jobs of a server run at once, and in what order the first of them start.

`Admission` bounds the jobs running at once (`concurrency`: gate.default_concurrency), runs a job
`alone` on request (the caller re-runs alone a job that ran out of memory beside others, so a
neighbour's memory is never charged to a candidate), and holds the device's host-wide lock
(server/device_lock.py) for the server's busy period: the first job of a busy period takes it
before it starts (the others admitted meanwhile wait for that), and the last to end lets it go.

**The first wave** (issue 59). A batch handed to an idle server used to start every job of its
first wave at once: each forked, imported, compiled and checked beside all the others, and the
first reached the timing slot only when the whole wave's host work had shared the cores, while
every job that reaches the slot stops all the others (server/gate.py). So the wave is staggered:
until a job of the busy period first takes the timing slot, the k-th job of the period is admitted
no earlier than `stagger_s` x k after the first. The first job then starts alone and reaches the
slot early, the next ones start behind it and are ready in turn when it lets the slot go, and the
wave is whole within (limit - 1) x stagger_s. Once a job has taken the slot, or the wave is whole,
jobs are admitted as others end, as before (their starts are staggered by the jobs' own ends). A
job waiting here has no clock running (it has not started) and is cancelled as any queued job.
On the CPU the stagger is 0 (the interpreter's jobs are the host work itself); on a GPU
`KERNELAGENT_FIRST_WAVE_S` (default 0.5 s, about a warm job's 'start' stage on an H200), 0 to turn
it off.

**A problem's baselines** (issue 59 scope 2: `admit(baselines=True)`, a job with the reference's
process only) are admitted beside the candidates' jobs, up to `limit` of their own, and not
staggered: every result of the problem waits for them. Counted among the candidates, they queued
behind a full first wave and started only as its jobs ended (a one-GPU bench's fill, session 36:
one problem's baselines started 14 s after its first candidate, whose result waited 25 s).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from kernelagent.harness.server.device_lock import DeviceLock
    from kernelagent.harness.server.record_types import DeviceLockInfo


class Admission:
    """At most `limit` jobs at once; a job `alone` waits for every other to end and keeps the
    others out while it runs (a reader-writer lock, writers first); a busy period's first wave
    staggered by `stagger_s` until a job takes the slot (`slot_taken`). With a `device_lock`,
    the first job of a busy period takes the device's host-wide lock before it starts, and the
    last to end lets it go. `admit` yields what the job's result records of that lock
    (`device_lock`, `device_lock_wait_s`) and, where the wave is staggered, how long it waited to
    be admitted (`admission_wait_s`)."""

    def __init__(self, limit: int, device_lock: DeviceLock | None = None, stagger_s: float = 0.0):
        self.limit = max(1, int(limit))
        self.device_lock = device_lock
        self.stagger_s = max(0.0, float(stagger_s))
        self._cond = threading.Condition()
        self._running = 0
        self._baselines = 0  # of the running, the problems' baselines' jobs (their own limit)
        self._alone = False
        self._alone_waiting = 0
        self._acquiring = False
        self._lock_info: dict[str, Any] = {}
        # the busy period's first wave: when its first job was admitted, how many so far, and
        # whether a job of the period has taken the slot (the wave then open)
        self._period_start: float | None = None
        self._period_admitted = 0
        self._slot_taken = False

    def slot_taken(self) -> None:
        """A job took the timing slot (gate.Gate.hold_listeners): the rest of the wave may start."""
        with self._cond:
            if not self._slot_taken:
                self._slot_taken = True
                self._cond.notify_all()

    def wave_open(self) -> bool:
        """Has a job of this busy period taken the slot (the rest of its wave free to start)?"""
        with self._cond:
            return self._slot_taken

    def _wave_wait(self) -> float:
        """Seconds the next job of the first wave must still wait (0: it may start). Under the lock."""
        if self.stagger_s <= 0 or self._period_start is None or self._slot_taken \
                or self._period_admitted >= self.limit:
            return 0.0
        return self._period_start + self.stagger_s * self._period_admitted - time.monotonic()

    def _full(self, baselines: bool) -> bool:
        """No room for one more job of this kind (under the lock)."""
        if baselines:
            return self._baselines >= self.limit
        return self._running - self._baselines >= self.limit

    @contextmanager
    def admit(self, alone: bool = False, baselines: bool = False) -> Iterator[DeviceLockInfo]:
        """Admit one job; `baselines`: a problem's baselines' job (admitted beside the candidates'
        jobs, never staggered: the module's docstring)."""
        queued = time.monotonic()
        baselines = baselines and not alone
        with self._cond:
            if alone:
                self._alone_waiting += 1
                try:
                    while self._running or self._alone:
                        self._cond.wait()
                finally:
                    self._alone_waiting -= 1
                self._alone = True
            else:
                while True:
                    if self._alone or self._alone_waiting or self._acquiring or self._full(baselines):
                        self._cond.wait()
                        continue
                    left = 0.0 if baselines else self._wave_wait()
                    if left <= 0:
                        break
                    self._cond.wait(timeout=left)
            if self._running == 0:  # a new busy period: its first wave starts now
                self._period_start, self._period_admitted, self._slot_taken = time.monotonic(), 0, False
            if not baselines:  # the wave's order is the candidates'
                self._period_admitted += 1
            self._running += 1
            self._baselines += baselines
            first = self._running == 1 and self.device_lock is not None
            if first:
                self._acquiring = True
        info: DeviceLockInfo = {}
        try:
            if first:
                try:
                    info = self.device_lock.acquire()
                finally:
                    with self._cond:
                        self._acquiring = False
                        self._lock_info = dict(info)
                        self._cond.notify_all()
            elif self.device_lock is not None:
                info = {"device_lock": self._lock_info.get("device_lock"), "device_lock_wait_s": 0.0}
            if self.stagger_s > 0:
                info["admission_wait_s"] = round(time.monotonic() - queued, 4)
            yield info
        finally:
            with self._cond:
                self._running -= 1
                self._baselines -= baselines
                if alone:
                    self._alone = False
                if self._running == 0 and self.device_lock is not None:
                    self.device_lock.release()
                self._cond.notify_all()

    def running(self) -> int:
        with self._cond:
            return self._running

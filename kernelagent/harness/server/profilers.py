"""Nsight Compute sessions and in-process profilers (CUPTI) never meet on one device.

The kernel evidence's ncu session (server/evidence.py) is started early, while its job's checks
run, and waits at READY with Nsight Compute's injection loaded and a CUDA context made. A
candidate's process that profiles itself with torch.profiler meanwhile (its device share, or the
profile a user asked for: child/candidate_side.py `finish`) hung in that profiler until its stage
limit (docs/concepts/concurrency.md, "Profilers never meet"). So one server keeps them apart:

- a session is `live` from its start to its end (`started`/`ended`, early or late);
- a job that profiles in its own process takes `in_process()`: it waits (its clock paused) until
  no session is live (past its stage limit it skips the profile, with a note), and while it waits or profiles, no new session starts (`may_start` says
  no to an early one: that job's session starts late, after its verdict; a late one waits in
  `session()`).

Nothing waits on itself: a job that profiles in-process never started an early session, and a
live session ends with its own job, which never waits here for another job's profile.

A spare (`put_spare`/`take_spare`) is an early session started ahead for the next job of a problem
(server/evidence.py): counted live and early like any, taken over by that job, and ended at once
when an in-process profile asks for the device's profiler or a job's own session needs its place.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator


class Profilers:
    def __init__(self, max_early: int = 3) -> None:
        self._cond = threading.Condition()
        self.live = 0  # ncu sessions started and not yet ended
        self.early = 0  # of those, started early (beside their job's checks)
        self.in_process_users = 0  # jobs waiting for, or inside, an in-process profile
        # At most this many early sessions at once: each is an interpreter importing torch and
        # a CUDA context, and one profiles at a time on a device anyway (ncu.ncu_lock). One per
        # job swamped a host's CPUs until a job ran past its stage limit (docs/concepts/
        # concurrency.md, "The evidence starts beside the checks").
        self.max_early = max_early
        self.spares: dict[Any, Any] = {}  # key -> a session waiting at READY for that key's next job

    def may_start(self) -> bool:
        """An early session may start now (no in-process profile runs or waits, fewer than
        `max_early` early ones live); if so it is counted live at once (`ended(early=True)`
        when it is gone)."""
        with self._cond:
            if self.in_process_users or self.early >= self.max_early:
                return False
            self.live += 1
            self.early += 1
            return True

    def put_spare(self, key: Any, spare: Any) -> None:
        """Keep `spare` (counted by may_start) for the next job of `key`; one per key (another
        one already kept is ended)."""
        with self._cond:
            old = self.spares.pop(key, None)
            self.spares[key] = spare
        if old is not None:
            self._end_spare(old)

    def has_spare(self, key: Any) -> bool:
        with self._cond:
            return key in self.spares

    def take_spare(self, key: Any) -> Any:
        """The spare kept for `key`, still counted (the taker ends it: `ended(early=True)`), or
        None. One whose session has ended meanwhile (it waited past its wait) is ended here."""
        with self._cond:
            spare = self.spares.pop(key, None)
        if spare is None:
            return None
        if not _alive(spare):
            self._end_spare(spare)
            return None
        return spare

    def drop_spares(self) -> int:
        """End every kept spare; how many were ended."""
        with self._cond:
            dropped = list(self.spares.values())
            self.spares.clear()
        for spare in dropped:
            self._end_spare(spare)
        return len(dropped)

    def _end_spare(self, spare: Any) -> None:
        try:
            spare.discard()
        finally:
            self.ended(early=True)

    def ended(self, early: bool = False) -> None:
        with self._cond:
            self.live = max(0, self.live - 1)
            if early:
                self.early = max(0, self.early - 1)
            self._cond.notify_all()

    @contextmanager
    def session(self, job: object, timeout: float) -> Iterator[bool]:
        """Around a late session: waits (the job's clock paused) while an in-process profile runs
        or waits, then counts the session live until it ends. Yields False when it waited past
        `timeout` (the session then does not run)."""
        with self._paused(job):
            with self._cond:
                if not self._cond.wait_for(lambda: self.in_process_users == 0, timeout):
                    yield False
                    return
                self.live += 1
        try:
            yield True
        finally:
            self.ended()

    @contextmanager
    def in_process(self, job: object, timeout: float) -> Iterator[bool]:
        """Around a candidate's in-process profile: waits (its clock paused) until no session is
        live, at most `timeout`; yields whether none is (else the caller skips the profile and
        says so: it is evidence and feedback, never a gate, and a job must not hang in it)."""
        started = time.monotonic()
        with self._cond:
            self.in_process_users += 1
        self.drop_spares()  # a spare would hold the device's profiler until its wait ran out
        try:
            with self._paused(job):
                with self._cond:
                    clear = self._cond.wait_for(lambda: self.live == 0, timeout)
            self.waited_s = time.monotonic() - started
            yield clear
        finally:
            with self._cond:
                self.in_process_users -= 1
                self._cond.notify_all()

    @staticmethod
    @contextmanager
    def _paused(job: object) -> Iterator[None]:
        pause = getattr(job, "pause_clock", None)
        if pause is not None:
            pause(True)
        try:
            yield
        finally:
            if pause is not None:
                pause(False)


def _alive(spare: Any) -> bool:
    session = getattr(spare, "session", None)
    proc = getattr(session, "proc", None)
    return proc is not None and proc.poll() is None

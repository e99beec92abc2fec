"""The first wave (issue 59 scope 4, server/admission.py): a batch handed to an idle server starts
its jobs staggered until one of them takes the timing slot, so that one job reaches the slot early
instead of the whole wave starting, compiling and waiting at once. Times here are lower bounds
(a job never starts before its turn) with generous upper ones (a 2-core CI machine)."""

from __future__ import annotations

import threading
import time

import pytest

from kernelagent.harness.server.admission import Admission
from kernelagent.harness.server.gate import Gate

STAGGER = 0.3


def _wave(admission: Admission, n: int, *, hold_s: float = 1.5, on_admit=None) -> list[float]:
    """n jobs asked for at once; each admission's time from the first request (s), by job."""
    started = time.monotonic()
    times: list[float] = [0.0] * n
    waits: list[object] = [None] * n

    def job(i: int) -> None:
        with admission.admit() as info:
            times[i] = time.monotonic() - started
            waits[i] = info.get("admission_wait_s")
            if on_admit is not None:
                on_admit(i)
            time.sleep(hold_s)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.002)  # requests in this order
    for t in threads:
        t.join()
    _wave.waits = waits
    return times


def test_the_first_wave_starts_one_job_at_a_time_until_the_slot_is_taken():
    times = sorted(_wave(Admission(4, stagger_s=STAGGER), 4))
    assert times[0] < 0.2
    for k in range(1, 4):  # the k-th job of the period: no earlier than k staggers after the first
        assert times[k] - times[0] >= k * STAGGER - 0.02, times
        assert times[k] - times[0] < k * STAGGER + 1.0, times
    assert all(isinstance(w, float) and w >= 0 for w in _wave.waits)  # the result records the wait


def test_the_slot_opens_the_wave():
    admission = Admission(4, stagger_s=5.0)  # a stagger no test waits out

    def first_takes_the_slot(i: int) -> None:
        if i == 0:
            time.sleep(0.1)
            admission.slot_taken()

    times = sorted(_wave(admission, 4, hold_s=0.5, on_admit=first_takes_the_slot))
    assert times[-1] < 3.0, times  # not 3 x 5 s: the slot was taken, the wave opened
    assert times[1] >= 0.09, times  # but not before it was taken


@pytest.mark.parametrize("stagger", [0.0])
def test_no_stagger_starts_the_wave_at_once(stagger):
    times = sorted(_wave(Admission(4, stagger_s=stagger), 4, hold_s=0.3))
    assert times[-1] < 0.25, times
    assert _wave.waits == [None] * 4  # nothing recorded where nothing is staggered


def test_jobs_after_the_wave_and_a_new_busy_period():
    """A job that replaces one that ended starts as soon as there is room; a busy period that
    begins after the server was idle staggers its own first wave again."""
    admission = Admission(2, stagger_s=STAGGER)
    times = sorted(_wave(admission, 3, hold_s=0.4))
    # two of the wave (0, STAGGER), the third when the first ends (0.4), not at 2 x STAGGER more
    assert times[1] >= STAGGER - 0.02 and times[2] >= 0.4 - 0.02
    assert times[2] < 0.4 + STAGGER + 0.5, times
    again = sorted(_wave(admission, 2, hold_s=0.1))
    assert again[1] - again[0] >= STAGGER - 0.02, again


class _Job:
    job_id = "j"

    def freeze(self, stop: bool) -> None:
        pass

    def freeze_candidate(self, stop: bool) -> None:
        pass

    def pause_clock(self, paused: bool) -> None:
        pass


def test_the_gate_tells_the_admission_when_a_job_takes_the_slot(monkeypatch):
    """The server's wiring (main.Dispatcher.make_admission): on a GPU with several jobs at once
    the stagger comes from KERNELAGENT_FIRST_WAVE_S and the gate's hold opens the wave; on the
    CPU, or one job at a time, nothing is staggered."""
    from kernelagent.harness.server.main import Dispatcher

    monkeypatch.setenv("KERNELAGENT_FIRST_WAVE_S", "0.7")
    gate = Gate()
    admission = Dispatcher.make_admission({"cuda": True}, 4, gate)
    assert admission.stagger_s == pytest.approx(0.7)
    assert Dispatcher.make_admission({"cuda": False}, 4, Gate()).stagger_s == 0
    assert Dispatcher.make_admission({"cuda": True}, 1, Gate()).stagger_s == 0
    assert not admission.wave_open()
    with gate.hold(_Job()):
        pass
    assert admission.wave_open()

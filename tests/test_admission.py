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
    """A job as the gate sees it (gate.Freezable): a candidate's evaluation, or a problem's
    baselines' job (`baselines_only`)."""

    def __init__(self, job_id: str = "j", baselines_only: bool = False):
        self.job_id, self.baselines_only = job_id, baselines_only

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


def test_a_problems_baselines_start_beside_a_full_wave_and_are_not_staggered():
    """Issue 59 scope 2: a problem's baselines' job is admitted beside the candidates' jobs (a
    limit of its own) and without the first wave's stagger. Counted among the candidates, it
    queued behind a full wave (session 36, one H200: a problem's baselines started 14 s after its
    first candidate). Candidates still start no more than `limit` at a time, baselines' jobs too."""
    admission = Admission(2, stagger_s=5.0)  # a stagger no test waits out
    release = threading.Event()
    admitted: list[tuple[str, float]] = []
    lock = threading.Lock()
    started = time.monotonic()

    def job(name: str, baselines: bool) -> None:
        with admission.admit(baselines=baselines):
            with lock:
                admitted.append((name, time.monotonic() - started))
            release.wait(10)

    threads = [threading.Thread(target=job, args=("candidate-0", False))]
    threads[0].start()
    time.sleep(0.1)  # the wave's first job; a second candidate would wait 5 s for its turn
    for name, baselines in (("candidate-1", False), ("baselines-0", True), ("baselines-1", True),
                            ("baselines-2", True)):
        threads.append(threading.Thread(target=job, args=(name, baselines)))
        threads[-1].start()
    time.sleep(1.0)
    with lock:
        names = {name for name, _ in admitted}
    # two baselines' jobs at once beside the running candidate, unstaggered; the third waits for room
    assert names == {"candidate-0", "baselines-0", "baselines-1"}, admitted
    assert admission.running() == 3
    release.set()
    for t in threads:
        t.join(15)
    assert {name for name, _ in admitted} == {"candidate-0", "candidate-1", "baselines-0", "baselines-1",
                                              "baselines-2"}
    assert admission.running() == 0


def test_a_job_run_alone_waits_for_the_baselines_jobs_too():
    """`alone` (a job re-run after it ran out of memory beside others) means alone on the device:
    a baselines' job running keeps it waiting, and none is admitted while it runs."""
    admission = Admission(2)
    release, order = threading.Event(), []

    def baselines() -> None:
        with admission.admit(baselines=True):
            order.append("baselines")
            release.wait(10)
            order.append("baselines ending")  # still admitted: nothing alone may start before this

    def alone() -> None:
        with admission.admit(alone=True):
            order.append("alone")

    first = threading.Thread(target=baselines)
    first.start()
    time.sleep(0.1)
    second = threading.Thread(target=alone)
    second.start()
    time.sleep(0.3)
    assert order == ["baselines"]
    release.set()
    first.join(10)
    second.join(10)
    assert order == ["baselines", "baselines ending", "alone"]

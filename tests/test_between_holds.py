"""A job ends its processes between holds of the timing slot (server/gate.py `between_holds`):
memory a killed process held is cleared by the driver in the background and takes bandwidth from
whatever the holder is timing or profiling meanwhile."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from kernelagent.harness.result import Status
from kernelagent.harness.server import gate as gate_mod


def _job(name: str, paused: list[bool] | None = None) -> SimpleNamespace:
    return SimpleNamespace(job_id=name, freeze=lambda stop: None, freeze_candidate=lambda stop: None,
                           pause_clock=(paused.append if paused is not None else (lambda p: None)))


def _held_for(gate: gate_mod.Gate, seconds: float) -> tuple[threading.Thread, list[float]]:
    taken, released = threading.Event(), []

    def hold() -> None:
        with gate.hold(_job("holder")):
            taken.set()
            time.sleep(seconds)
            released.append(time.monotonic())

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(5)
    return thread, released


def test_ending_waits_for_the_holder_and_pauses_the_enders_clock():
    gate, paused = gate_mod.Gate(idle_wait_s=1.0), []
    thread, released = _held_for(gate, 0.4)
    with gate.between_holds(_job("ender", paused)):
        ended_at = time.monotonic()
        assert gate.holder() is None
    thread.join(5)
    assert released and ended_at >= released[0], "a process was ended while another job held the slot"
    assert paused == [True, False], "the wait for the slot was charged to the ending job's stage clock"


def test_no_hold_starts_while_a_job_ends_its_processes():
    gate = gate_mod.Gate(idle_wait_s=1.0)
    order: list[str] = []

    def take() -> None:
        with gate.hold(_job("timer")):
            order.append("held")

    with gate.between_holds(_job("ender")):
        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        time.sleep(0.2)
        order.append("killed")
    thread.join(5)
    assert order == ["killed", "held"]


def test_a_job_kills_its_reference_only_between_holds(monkeypatch):
    """Job.finish_result, as far as its reference's kill: with another job holding the slot, the
    kill waits for its release."""
    from kernelagent.harness.server import evidence, job as job_mod, trace_stage
    from kernelagent.harness.server.job_record import JobRecord

    class Stop(Exception):
        pass

    killed: list[float] = []
    job = job_mod.Job.__new__(job_mod.Job)
    job.facts = JobRecord(status=Status.INCORRECT)
    job.request, job.cpu, job.ref, job.job_id = {"want_baselines": False}, {}, None, "ender"
    job.pause_clock = lambda paused: None
    job.memory = SimpleNamespace(reference_stats=lambda: None)
    monkeypatch.setattr(job_mod.Job, "publish_build", lambda self: None)
    monkeypatch.setattr(evidence, "stage", lambda j: None)
    monkeypatch.setattr(job_mod, "kill_group", lambda proc: killed.append(time.monotonic()))
    monkeypatch.setattr(trace_stage, "close_reference", lambda j: (_ for _ in ()).throw(Stop()))
    job.gate = gate_mod.Gate(idle_wait_s=1.0)
    thread, released = _held_for(job.gate, 0.4)
    with pytest.raises(Stop):
        job.finish_result()
    thread.join(5)
    assert killed and released and killed[0] >= released[0]

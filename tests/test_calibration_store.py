"""Calibrations shared by the servers of one host (server/calibration_store.py, issue 59): keyed by
everything that changes the empty loop's cost, never read across GPU models or problems, and
read back only when they are what a calibration is."""

from __future__ import annotations

import json

import pytest

from kernelagent.harness.server.calibration_store import Calibration, CalibrationStore, key

H200 = {"gpu_name": "NVIDIA H200", "driver": "580", "torch": "2.11", "triton": "3.6", "python": "3.12",
        "trace": {"library": "/cache/libkernelagent_trace.so"}}
ORDER = {"calls": 40, "warmup_calls": 5, "keep": 2, "segments": 2, "budget_bytes": 1 << 20, "l2_bytes": None,
         "payloads": False}
SETTINGS = {"target_ms": 200.0, "flush_l2": True}


def _key(fingerprint=H200, source="class Model: pass\n", settings_=SETTINGS, order=ORDER):
    return key(fingerprint, problem_source=source, settings_=settings_, order=order)


def test_a_calibration_one_server_stored_is_read_by_another(tmp_path):
    one, two = CalibrationStore(tmp_path / "cal"), CalibrationStore(tmp_path / "cal")
    one.put(_key(), Calibration(0.596, True))
    assert two.get(_key()) == Calibration(0.596, True)
    assert [p.suffix for p in (tmp_path / "cal").iterdir()] == [".json"]  # no temporary file left


@pytest.mark.parametrize("other", [
    {"fingerprint": {**H200, "gpu_name": "NVIDIA H100 80GB HBM3"}},
    {"fingerprint": {**H200, "driver": "575"}},
    {"fingerprint": {**H200, "torch": "2.13"}},
    {"fingerprint": {**H200, "trace": {"unavailable": "no CUDA device"}}},
    {"source": "class Model: pass  # another problem\n"},
    {"settings_": {**SETTINGS, "target_ms": 100.0}},
    {"order": {**ORDER, "segments": 4}},
], ids=["gpu model", "driver", "torch", "untraced", "problem", "settings", "loop shape"])
def test_no_calibration_is_read_across_what_changes_its_cost(tmp_path, other):
    store = CalibrationStore(tmp_path)
    store.put(_key(), Calibration(0.6, False))
    assert _key(**other) != _key() and store.get(_key(**other)) is None
    assert _key(fingerprint={**H200, "gpu_uuid": "GPU-1234"}) == _key()  # another GPU of the same model shares


@pytest.mark.parametrize("content", [
    {"format": 1, "seconds": -1.0, "recalibrated": False},
    {"format": 1, "seconds": 0, "recalibrated": False},
    {"format": 1, "seconds": 1e9, "recalibrated": False},
    {"format": 1, "seconds": True, "recalibrated": False},
    {"format": 1, "seconds": "0.5", "recalibrated": False},
    {"format": 1, "seconds": 0.5, "recalibrated": "yes"},
    {"format": 2, "seconds": 0.5, "recalibrated": False},
    [0.5],
], ids=lambda c: json.dumps(c)[:40])
def test_what_is_not_a_calibration_is_not_read(tmp_path, content):
    (tmp_path / f"{_key()}.json").write_text(json.dumps(content))
    assert CalibrationStore(tmp_path).get(_key()) is None


def test_a_link_a_bad_key_or_the_setting_off_reads_and_writes_nothing(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"format": 1, "seconds": 0.5, "recalibrated": False}))
    (tmp_path / f"{_key()}.json").symlink_to(target)
    assert CalibrationStore(tmp_path).get(_key()) is None
    assert CalibrationStore(tmp_path).get("../elsewhere") is None
    off = CalibrationStore(tmp_path / "off", environ={"KERNELAGENT_SHARED_CALIBRATION": "0"})
    off.put(_key(), Calibration(0.5, False))
    assert off.get(_key()) is None and not (tmp_path / "off").exists()
    assert CalibrationStore(None).get(_key()) is None


class _Job:
    """The parts of a job server/calibration.py's Calibration reads (seams.CalibrationJob)."""

    def __init__(self, gate, cuda=True):
        from kernelagent.harness.config import EvalConfig
        from kernelagent.harness.server.job_record import JobRecord

        self.gate, self.fingerprint, self.config = gate, {"cuda": cuda}, EvalConfig()
        self.concurrency, self.facts = {}, JobRecord(timed_loop={})


def _server(tmp_path, cuda=True):
    """A server's gate as serve() makes it, given the caller's calibration folder."""
    from kernelagent.harness.server.main import Dispatcher

    return Dispatcher.make_gate({"cuda": cuda}, 1, calibration_cache=tmp_path / "calibrations")


def _calibration(job, measured):
    from kernelagent.harness.server.calibration import Calibration as Stage

    stage = Stage(job)
    stage.calibrate = lambda order, segments, deadline: measured.pop(0)  # the reference's empty loop
    return stage


def test_a_second_server_reuses_what_the_first_measured_and_recalibrated(tmp_path):
    """The wiring (server/calibration.py): the first server measures and stores; another server of
    the host reads it without holding the slot to measure, and a calibration measured twice is
    not measured again there either (recalibration_wanted)."""
    key_ = _key()
    first = _calibration(_Job(_server(tmp_path)), [0.62, 0.596])
    assert first.first(None, segments=2, deadline=0, key=key_) == (0.62, False) and not first.shared
    assert first.recalibrate(None, segments=2, deadline=0, first_s=0.62, key=key_) == 0.596
    second_job = _Job(_server(tmp_path))
    second = _calibration(second_job, [])  # measuring would pop from an empty list
    assert second.first(None, segments=2, deadline=0, key=key_) == (0.596, True) and second.shared
    assert key_ in second_job.gate.recalibrated
    assert not second.recalibration_wanted(key_, [0.01] * 10, 10, 10.0, 0.596)


def test_on_the_cpu_nothing_is_shared(tmp_path):
    key_ = _key()
    one = _calibration(_Job(_server(tmp_path, cuda=False), cuda=False), [0.5])
    assert one.first(None, segments=1, deadline=0, key=key_) == (0.5, False)
    assert not (tmp_path / "calibrations").exists()

"""Calibrations shared by the servers of one host (server/calibration_store.py, issue 59): keyed by
everything that changes the empty loop's cost, never read across GPU models or problems, and
read back only when they are what a calibration is."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

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


# -- the loop's plan, shared so that the calibration's key is ---------------------------------------
def _timed(gate, estimate_ms, free=80 << 30, source="P = 1\n", gpu="NVIDIA H200"):
    """A job's timed loop on a GPU of `gpu`'s model (test_eval_cost._timed_job)."""
    from tests.test_eval_cost import _timed_job

    return _timed_job(True, gate, estimate_ms, free, fingerprint={**H200, "gpu_name": gpu}, source=source)


def test_a_second_server_runs_the_first_servers_plan_so_reads_its_calibration(tmp_path):
    """Two servers of the host time one problem; their first jobs' eager times differ by 4%. Without
    the shared plan each made a loop of its own length, so a calibration key of its own, and held
    its slot to calibrate (run P on two H200s: 9.98 s of calibration in the slot against 5.63 s
    on one). With it, the second server runs the first's plan, and the first's calibration counts."""
    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.server.timed import loop_plan

    one, two = _server(tmp_path), _server(tmp_path)
    first_loop, second_loop = _timed(one, 0.5), _timed(two, 0.52)
    first, reused = first_loop.loop_plan(0.5, SETTINGS)
    assert not reused and not first_loop.plan_shared
    own = loop_plan(EvalConfig(), 0.52, second_loop.harness_budget(), 64 << 20)
    assert own["total"] != first["total"]  # what the second server would run on its own
    second, reused = second_loop.loop_plan(0.52, SETTINGS)
    assert second == first and reused and second_loop.plan_shared
    assert two.plans and list(two.plans.values()) == [first]  # its later jobs run it without the store

    order = {"calls": first["calls"], "segments": first["segments"]}
    key_ = _key(order=order)
    measuring = _calibration(_Job(one), [0.62])
    assert measuring.first(None, segments=first["segments"], deadline=0, key=key_) == (0.62, False)
    reading = _calibration(_Job(two), [])  # measuring would pop from an empty list
    assert reading.first(None, segments=second["segments"], deadline=0, key=_key(order=order)) == (0.62, True)


@pytest.mark.parametrize("other", [{"source": "P = 2\n"}, {"gpu": "NVIDIA H100 80GB HBM3"}],
                         ids=["problem", "gpu model"])
def test_no_plan_is_read_across_problems_or_gpu_models(tmp_path, other):
    _timed(_server(tmp_path), 0.5).loop_plan(0.5, SETTINGS)
    elsewhere = _timed(_server(tmp_path), 0.52, **other)
    assert elsewhere.loop_plan(0.52, SETTINGS)[1] is False and not elsewhere.plan_shared
    # other settings (a target of its own): a plan of their own too
    same = _timed(_server(tmp_path), 0.52)
    assert same.loop_plan(0.52, {**SETTINGS, "target_ms": 100.0})[1] is False


def test_a_shared_plan_that_does_not_fit_this_servers_memory_is_not_run(tmp_path):
    _timed(_server(tmp_path), 0.5).loop_plan(0.5, SETTINGS)
    short = _timed(_server(tmp_path), 0.5, free=256 << 20)  # 30% of 256 MiB cannot hold the kept outputs
    plan, reused = short.loop_plan(0.5, SETTINGS)
    assert not reused and not short.plan_shared
    assert plan["keep"] * (64 << 20) + plan["budget_bytes"] <= short.harness_budget()


@pytest.mark.parametrize("plan", [
    {"total": 512, "warmup": 4, "keep": 2, "segments": 128, "calls": 2},  # a field missing
    {"total": 512, "warmup": 4, "keep": 2, "segments": 128, "calls": 2, "budget_bytes": 1, "x": 1},
    {"total": 512, "warmup": 4, "keep": 2, "segments": 128, "calls": 2, "budget_bytes": -1},
    {"total": 512, "warmup": 4, "keep": 2, "segments": 128, "calls": True, "budget_bytes": 1},
    {"total": 512, "warmup": 4, "keep": 2, "segments": 128, "calls": 2.0, "budget_bytes": 1},
    {"total": 512, "warmup": 4, "keep": 3, "segments": 128, "calls": 2, "budget_bytes": 1},
    {"total": 512, "warmup": 4, "keep": 2, "segments": 0, "calls": 2, "budget_bytes": 1},
    {"total": 100, "warmup": 4, "keep": 2, "segments": 128, "calls": 2, "budget_bytes": 1},
    {"total": 1 << 30, "warmup": 4, "keep": 2, "segments": 128, "calls": 2, "budget_bytes": 1},
    [512, 4, 2, 128, 2, 1],
], ids=["missing", "extra", "negative", "bool", "float", "keeps more than it calls", "no segment",
        "more calls than total", "huge", "not a dict"])
def test_what_is_not_a_plan_is_not_run(tmp_path, plan):
    from kernelagent.harness.server.calibration_store import plan_key

    server = _server(tmp_path)
    loop = _timed(server, 0.5)
    shared_key = plan_key(loop.job.fingerprint, problem_source="P = 1\n", settings_=SETTINGS, output_bytes=64 << 20)
    (tmp_path / "calibrations").mkdir(exist_ok=True)
    (tmp_path / "calibrations" / f"plan-{shared_key}.json").write_text(json.dumps({"format": 1, "plan": plan}))
    assert server.calibration_store.get_plan(shared_key) is None
    made, reused = loop.loop_plan(0.5, SETTINGS)
    assert not reused and not loop.plan_shared and made["total"] >= 1
    good = {"total": 512, "warmup": 4, "keep": 2, "segments": 128, "calls": 2, "budget_bytes": 1}
    (tmp_path / "calibrations" / f"plan-{shared_key}.json").write_text(json.dumps({"format": 1, "plan": good}))
    assert server.calibration_store.get_plan(shared_key) == good  # the same file, well formed: read


def test_the_first_plan_written_is_every_servers(tmp_path):
    """Two servers make a plan at once: the second's write finds the first's there (a link, not a
    replace) and runs it, so both read one calibration."""
    from kernelagent.harness.server.calibration_store import plan_key

    store_a, store_b = CalibrationStore(tmp_path), CalibrationStore(tmp_path)
    shared_key = plan_key(H200, problem_source="P = 1\n", settings_=SETTINGS, output_bytes=64 << 20)
    a = {"total": 512, "warmup": 4, "keep": 2, "segments": 128, "calls": 2, "budget_bytes": 1 << 30}
    b = {**a, "total": 520, "budget_bytes": 1 << 29}
    assert store_a.put_plan(shared_key, a) == a
    assert store_b.put_plan(shared_key, b) == a
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"plan-{shared_key}.json"]  # no temporary file left
    assert CalibrationStore(None).put_plan(shared_key, b) == b  # no store: its own


# -- two servers calibrating one loop at once ------------------------------------------------------
def test_a_server_that_finds_another_measuring_runs_its_loop_first_then_reads_that_one(tmp_path):
    """The race a batch makes (each server's first jobs of a problem reach their slots together):
    the second server does not measure beside the first. Its candidate's loop runs first, and the
    calibration the first server stored meanwhile counts; the wait is charged to the slot's
    calibration clock."""
    key_ = _key()
    one, two = _server(tmp_path), _server(tmp_path)
    assert one.calibration_store.claim(key_)  # the first server's job is measuring now
    waiting = _calibration(_Job(two), [])  # measuring would pop from an empty list
    assert waiting.first(None, segments=2, deadline=0, key=key_) == (None, False) and waiting.deferred
    # ... its candidate's loop runs; the first server's measure lands and its claim goes
    one.calibration_store.put(key_, Calibration(0.61, False))
    one.calibration_store.release(key_)
    job = waiting.job
    assert waiting.after_loop(None, segments=2, deadline=0, key=key_) == (0.61, True) and waiting.shared
    assert job.gate.calibrations[key_] == 0.61 and "slot_calibration_s" in job.concurrency


def test_the_first_server_measures_under_its_claim_and_lets_it_go(tmp_path):
    key_ = _key()
    server = _server(tmp_path)
    stage = _calibration(_Job(server), [0.6])
    seen = []
    measure = stage.calibrate
    stage.calibrate = lambda *a: (seen.append(server.calibration_store.claimed(key_)), measure(*a))[1]
    assert stage.first(None, segments=2, deadline=0, key=key_) == (0.6, False) and not stage.deferred
    assert seen == [True] and not server.calibration_store.claimed(key_)  # held while measuring only
    failing = _calibration(_Job(_server(tmp_path)), [None])  # out of device memory: ReferenceGone
    from kernelagent.harness.server.stages import ReferenceGone

    with pytest.raises(ReferenceGone):
        failing.first(None, segments=2, deadline=0, key=_key(source="P = 3\n"))
    assert not server.calibration_store.claimed(_key(source="P = 3\n"))  # let go on a failure too


def test_a_deferred_calibration_none_came_for_is_measured_here(tmp_path, monkeypatch):
    from kernelagent.harness.server import calibration as calibration_mod

    monkeypatch.setattr(calibration_mod, "WAIT_S", 0.1)
    key_ = _key()
    one, two = _server(tmp_path), _server(tmp_path)
    assert one.calibration_store.claim(key_)  # a claim that stays fresh: the first server is slow
    stage = _calibration(_Job(two), [0.59])
    assert stage.first(None, segments=2, deadline=0, key=key_)[0] is None and stage.deferred
    assert stage.after_loop(None, segments=2, deadline=0, key=key_) == (0.59, False) and not stage.shared
    assert two.calibration_store.get(key_) == Calibration(0.59, False)  # stored for the others


def test_a_stale_claim_is_taken_over(tmp_path):
    import os
    import time

    from kernelagent.harness.server.calibration_store import CLAIM_S

    key_ = _key()
    one, two = _server(tmp_path), _server(tmp_path)
    assert one.calibration_store.claim(key_)
    claim = tmp_path / "calibrations" / f"claim-{key_}.json"
    old = time.time() - CLAIM_S - 5
    os.utime(claim, (old, old))  # its server died measuring
    stage = _calibration(_Job(two), [0.6])
    assert stage.first(None, segments=2, deadline=0, key=key_) == (0.6, False) and not stage.deferred
    assert not claim.exists()
    assert CalibrationStore(None).claim(key_)  # no store: every server measures its own


def test_the_timed_loop_runs_first_and_counts_the_other_servers_calibration(tmp_path, monkeypatch):
    """The wiring (server/timed.py _timed_loop): with another server's claim fresh, the candidate's
    loop runs before any calibration, and the time is decided on the other server's measure, read
    after the loop; the result says it was another server's."""
    import random

    from kernelagent.harness.server import timed as timed_mod

    one, two = _server(tmp_path), _server(tmp_path)
    loop = _timed(two, 0.5)
    job = loop.job
    job.rng, job.base_seed, job.hold, job.concurrency, job.request = random.Random(1), 7, None, {}, {}
    job.facts = SimpleNamespace(timed_loop={})
    settings = {k: v for k, v in job.config.to_dict().items() if k not in timed_mod.LOOP_NEUTRAL}
    plan, _ = _timed(one, 0.5).loop_plan(0.5, settings)  # the first server's plan, so its loop's key
    key_ = timed_mod.calibration_store.key(job.fingerprint, problem_source=job.problem_source,
                                           settings_=settings, order=loop._loop_order(plan).fields())
    assert one.calibration_store.claim(key_)  # the first server is measuring it
    events = []

    def segment(index, **kw):
        events.append("segment")
        if index == 0:  # the first server's measure lands while this loop runs
            one.calibration_store.put(key_, Calibration(0.61, False))
            one.calibration_store.release(key_)
        kw["samples"].extend([0.5] * kw["calls"])
        return True, True, 0.5 * kw["calls"] / 1e3

    monkeypatch.setattr(loop.calibration, "calibrate", lambda *a: events.append("measured") or 0.6)
    monkeypatch.setattr(loop, "_warm_candidate", lambda order, keep, deadline: [])
    monkeypatch.setattr(loop, "_timed_segment", segment)
    monkeypatch.setattr(loop, "clock_sampler", lambda expected_s: None)
    recorded = {}
    monkeypatch.setattr(loop, "_record_timing", lambda samples, **kw: recorded.update(kw))
    assert loop._timed_loop(time.monotonic() + 60)
    assert "measured" not in events and events[0] == "segment"
    assert recorded["calibration_s"] == 0.61
    assert job.facts.timed_loop["calibration_reused"] and job.facts.timed_loop["calibration_shared"]
    assert job.facts.timed_loop["plan_shared"] and job.facts.timed_loop["calibration_s"] == 0.61


def test_a_calibration_another_server_measured_twice_is_not_measured_a_third_time(tmp_path):
    """The second server read the first measure before the first server measured it again; when
    its own loop asks for a second measure, the first server's smaller one counts (no measure in
    this slot), and a first of its own that was smaller still counts."""
    key_ = _key()
    one, two = _server(tmp_path), _server(tmp_path)
    first = _calibration(_Job(one), [0.62, 0.596])
    assert first.first(None, segments=2, deadline=0, key=key_) == (0.62, False)
    second_job = _Job(two)
    second = _calibration(second_job, [])  # measuring would pop from an empty list
    assert second.first(None, segments=2, deadline=0, key=key_) == (0.62, True)  # before the second measure
    assert first.recalibrate(None, segments=2, deadline=0, first_s=0.62, key=key_) == 0.596
    assert second.recalibration_wanted(key_, [0.01] * 10, 10, 10.0, 0.62)  # its own loop asks for it
    assert second.recalibrate(None, segments=2, deadline=0, first_s=0.62, key=key_) == 0.596
    assert second_job.facts.timed_loop["recalibration_shared"] and key_ in two.recalibrated
    assert two.calibrations[key_] == 0.596
    third = _calibration(_Job(_server(tmp_path)), [])
    assert third.recalibrate(None, segments=2, deadline=0, first_s=0.5, key=key_) == 0.5  # its own was smaller

"""The job's typed record (server/job_record.py, issue 57): the server's stages write its fields,
never an untyped result dict, and its wire dict is what the caller builds its EvalResult from."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from kernelagent.harness import EvalConfig
from kernelagent.harness import verdict as fold
from kernelagent.harness.caller.results import merge
from kernelagent.harness.result import EvalResult, Status
from kernelagent.harness.server.job import Job
from kernelagent.harness.server.job_record import OPTIONAL, JobRecord

SERVER = Path(__file__).resolve().parents[1] / "kernelagent" / "harness" / "server"
# a job's (or a stage's job's) old result dict: job.result, self.result, self.job.result
OLD_DICT = re.compile(r"\b(?:job|self)\.result\b")

# The keys of the dict a fresh job's result held before anything ran (before the record).
ALWAYS = {"status", "reason", "stage", "correct", "compiled", "trials", "timings", "flags", "stage_seconds",
          "kernels", "memory"}
# Keys the caller takes out of the wire dict itself (caller/evaluator.py pops "evidence",
# caller/results.merge pops "baselines"); every other field is an EvalResult field of that name.
CALLER_OWN = {"evidence", "baselines"}


def test_no_server_module_writes_or_reads_the_old_result_dict():
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(SERVER.glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if OLD_DICT.search(line)]
    assert not found, "the job's result is its record, job.facts (server/job_record.py):\n" + "\n".join(found)


@pytest.mark.parametrize("line, old", [("job.result['flags'] = []", True), ('x = self.result.get("log")', True),
                                       ("self.job.result['memory'].update(a=1)", True),
                                       ("job.facts.flags.append(f)", False), ("f.result()", False)])
def test_the_scan_sees_the_old_dict(line, old):
    assert bool(OLD_DICT.search(line)) == old


def test_a_fresh_jobs_record_sends_what_its_result_dict_held(tmp_path):
    job = Job({"job": "j", "config": EvalConfig().to_dict(), "problem_source": "", "candidate_source": ""},
              tmp_path, {"free_bytes": 1 << 30}, {})
    assert not hasattr(job, "result")
    assert job.facts.to_wire() == {**fold.fields(fold.fold([])), "compiled": False, "trials": [], "timings": {},
                                   "flags": [], "stage_seconds": {}, "kernels": [], "memory": {}}
    assert set(JobRecord().to_wire()) == ALWAYS
    # the fold writes the record's verdict (Job.record), and a set optional field goes on the wire
    job.record(fold.Failed(Status.TIMEOUT, "stage 'load' ran past its limit", "load"))
    job.facts.device = "cpu"
    wire = job.facts.to_wire()
    assert (wire["status"], wire["stage"], wire["correct"], wire["device"]) == (Status.TIMEOUT, "load", False, "cpu")
    assert set(wire) == ALWAYS | {"device"}


def test_every_field_is_one_the_caller_reads():
    names = {f.name for f in dataclasses.fields(JobRecord)}
    evalresult = {f.name for f in dataclasses.fields(EvalResult)}
    assert set(OPTIONAL) <= names
    assert names - CALLER_OWN <= evalresult, sorted(names - CALLER_OWN - evalresult)


class _Cache:
    def __init__(self) -> None:
        self.put_calls: list[tuple[str, dict]] = []

    def put(self, key: str, value: dict) -> None:
        self.put_calls.append((key, value))


def _timing(ms: float) -> dict:
    return {"median_ms": ms, "q1_ms": ms, "q3_ms": ms, "min_ms": ms, "reps": 10, "meaningful": False}


def test_a_full_record_builds_the_callers_result():
    """Every field set as the stages set them; the caller's merge (caller/results.py) over its wire
    dict gives an EvalResult with each of them."""
    record = JobRecord(
        compiled=True, trials=[{"name": "trial 0", "seed": 7, "passed": True, "max_abs_err": 0.0, "max_rel_err": 0.0,
                                "rel_l2_err": 0.0, "precision": "float64", "message": ""}],
        timings={"candidate": _timing(2.0)}, flags=[{"kind": "x", "message": "m", "severity": "info"}],
        stage_seconds={"load": 1.5}, kernels=[{"name": "k", "total_ns": 10}], memory={"io_bytes": 64},
        log="tail", derived={"note": ""}, timed_loop={"calls": 40}, evidence={"source": "trace"},
        baselines={"timings": {"eager": _timing(4.0)}, "errors": {}}, workload={"input_bytes": 32},
        trace={"bytes": 22, "overflow": False, "ended": True}, seeds={"base": 3}, input_set="smoke", device="cpu",
        concurrency={"shared_device": False})
    fold.apply_to(record, [fold.Concluded(Status.CORRECT, "", None)])
    wire = record.to_wire()
    assert set(wire) == {f.name for f in dataclasses.fields(JobRecord)}
    raw = dict(wire)
    assert raw.pop("evidence") == {"source": "trace"}  # the caller's evaluator takes it out (caller/evaluator.py)
    cache = _Cache()
    result = merge(EvalResult(status=Status.HARNESS_ERROR), raw, None, "key", EvalConfig(), cache)
    assert (result.status, result.correct, result.compiled) == (Status.CORRECT, True, True)
    assert result.trials[0].seed == 7 and result.trials[0].precision == "float64"
    assert result.timings["candidate"].median_ms == 2.0 and result.timings["eager"].median_ms == 4.0
    assert result.speedups["eager"] == pytest.approx(2.0)
    assert [(f.kind, f.severity) for f in result.flags] == [("x", "info")]
    for name in ("stage_seconds", "kernels", "memory", "log", "derived", "timed_loop", "workload", "trace", "seeds",
                 "input_set", "device", "concurrency"):
        assert getattr(result, name) == wire[name], name
    assert cache.put_calls and cache.put_calls[0][1]["timings"] == {"eager": _timing(4.0)}

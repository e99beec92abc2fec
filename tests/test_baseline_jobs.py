"""A problem's baselines off its candidates' path (issue 59, scope 2; caller/baseline_jobs.py).

Where the server runs several jobs at once, the evaluation that takes a problem's baseline claim
starts a job of the baselines' own (protocol `evaluate_baselines`: the reference's process only)
beside its candidate's job: the baselines start before the candidate's checks end, they depend on
no candidate (an incorrect first candidate still leaves them in the cache, and no later evaluation
re-runs a candidate's job for them), and the holder's result carries them as the candidate's job
used to (timings, speedups, intervals).
"""

from __future__ import annotations

import pytest

from kernelagent.harness import EvalConfig, Evaluator, StageTimeouts, Status, protocol
from kernelagent.problem import load_problem
from tests.conftest import CANDIDATES, read

PROBLEM = CANDIDATES / "relu_problem.py"
# Each call of the candidate sleeps: its checks take seconds, its result is a correct ReLU.
SLOW = read(CANDIDATES / "relu_good.py").replace(
    "    def forward(self, x):\n        return relu(x)",
    "    def forward(self, x):\n        import time\n        time.sleep(0.4)\n        return relu(x)")


def _config() -> EvalConfig:
    return EvalConfig(trials=1, target_ms=20, warmup_ms=5, max_reps=10, derived_checks=0, kernel_evidence=False,
                      timeouts=StageTimeouts(start=60, load=60, compile=90, correctness=90, timing=60))


def test_the_baselines_start_before_the_candidate_finishes_its_checks(tmp_path):
    assert "time.sleep" in SLOW
    with Evaluator(device="cpu", cache_dir=tmp_path, concurrency=2) as ev:
        result = ev.evaluate(PROBLEM, SLOW, _config())
    assert result.status == Status.CORRECT, result.reason
    job = result.concurrency["baselines_job"]
    seconds = result.stage_seconds
    checks_end = result.concurrency["span"][0] + sum(seconds.get(s, 0.0) for s in ("start", "load", "compile",
                                                                                     "correctness"))
    assert seconds["correctness"] > 0.4  # the checks took the candidate's sleeps
    assert job["span"][0] < checks_end, (job, result.concurrency["span"], seconds)
    # its own waits, for the bench's timeline (bench_throughput.py: where a fill's first result waited)
    assert job["slot"]["held_s"] > 0 and job["slot"]["wait_s"] >= 0
    assert "eager" in result.timings and "eager" in result.speedups and not result.baselines_cached


def test_an_incorrect_first_candidate_still_leaves_the_baselines_in_the_cache(tmp_path):
    config = _config()
    with Evaluator(device="cpu", cache_dir=tmp_path, concurrency=2) as ev:
        wrong = ev.evaluate(PROBLEM, read(CANDIDATES / "relu_wrong.py"), config)
        assert wrong.status == Status.INCORRECT, wrong.reason
        key = ev.cache.key(load_problem(PROBLEM).sha256, wrong.fingerprint, config)
        with ev.cache.claim(key, wait_s=120) as held:  # what the next evaluation of the problem does
            assert held
            entry = ev.cache.get(key)
        assert entry is not None and "eager" in entry["timings"]
        good = ev.evaluate(PROBLEM, read(CANDIDATES / "relu_good.py"), config)
    assert good.status == Status.CORRECT, good.reason
    assert good.baselines_cached and "eager" in good.speedups
    assert "baselines_job" not in good.concurrency  # nothing re-ran for them


def test_the_holders_result_carries_the_baselines_as_the_candidates_job_did(tmp_path):
    """The same fields as where the candidate's job times them (a server of one job at a time)."""
    results = {}
    for jobs in (1, 2):
        with Evaluator(device="cpu", cache_dir=tmp_path / str(jobs), concurrency=jobs) as ev:
            results[jobs] = ev.evaluate(PROBLEM, read(CANDIDATES / "relu_good.py"), _config())
    in_job, own_job = results[1], results[2]
    assert in_job.status == own_job.status == Status.CORRECT, (in_job.reason, own_job.reason)
    assert "baselines_job" in own_job.concurrency and "baselines_job" not in in_job.concurrency
    assert set(own_job.timings) == set(in_job.timings) == {"candidate", "eager"}
    assert set(own_job.speedups) == set(in_job.speedups) == {"eager"}
    assert set(own_job.speedup_intervals) == set(in_job.speedup_intervals)
    assert set(vars(own_job.timings["eager"])) == set(vars(in_job.timings["eager"]))
    assert "baselines" in own_job.stage_seconds and "baselines" in in_job.stage_seconds
    # the compile's share of the stage, where the baselines ran in a job of their own and in the candidate's
    for result in (own_job, in_job):
        assert 0 < result.stage_seconds["baselines_compile"] <= result.stage_seconds["baselines"], result.stage_seconds
    baseline_flags = {"baseline-error", "baseline-skipped"}
    assert {f.kind for f in own_job.flags if f.kind in baseline_flags} == \
        {f.kind for f in in_job.flags if f.kind in baseline_flags}


GOOD = {"config": {}, "problem_source": "x = 1", "options": {}}


@pytest.mark.parametrize("fields, fragment", [
    ({**GOOD, "candidate_source": "print(1)"}, "unexpected fields"),  # never a candidate
    ({**GOOD, "want_baselines": True}, "unexpected fields"),
    ({k: v for k, v in GOOD.items() if k != "options"}, "missing field 'options'"),
    ({k: v for k, v in GOOD.items() if k != "problem_source"}, "missing field 'problem_source'"),
    ({**GOOD, "config": "{}"}, "wrong type"),
    ({**GOOD, "problem_source": ["x = 1"]}, "wrong type"),
    ({**GOOD, "options": None}, "wrong type"),
])
def test_a_malformed_baselines_request_is_refused(fields, fragment):
    import json

    accept = {"evaluate", "evaluate_baselines", "nonce", "cancel", "shutdown"}  # the Dispatcher's
    assert protocol.decode(protocol.encode("evaluate_baselines", "j", **GOOD), accept)["type"] == "evaluate_baselines"
    raw = json.dumps({"v": protocol.VERSION, "type": "evaluate_baselines", "job": "j", **fields}).encode()
    with pytest.raises(protocol.ProtocolError, match=fragment):
        protocol.decode(raw, accept)


TIMING = {"median_ms": 1.0, "q1_ms": 1.0, "q3_ms": 1.0, "min_ms": 1.0, "reps": 5, "meaningful": False, "note": ""}


def test_a_sibling_that_finds_no_entry_starts_the_baselines_job_never_its_candidates_again(tmp_path, monkeypatch):
    """Another evaluation held the problem's claim and let it go without an entry (its job
    failed, or it was killed): the sibling, once its own candidate is correct, holds the claim
    and sends a baselines' job; its candidate's job is sent once."""
    import threading

    ev = Evaluator(device="cpu", cache_dir=tmp_path)
    config = _config()
    ev._fingerprint = {"cuda": False, "concurrency": {"jobs": 2}}
    monkeypatch.setattr(ev, "start", lambda: None)
    key = ev.cache.key(load_problem(PROBLEM).sha256, ev._fingerprint, config)
    holding, let_go = threading.Event(), threading.Event()

    def other_holder():
        with ev.cache.claim(key, wait_s=0) as held:
            assert held
            holding.set()
            let_go.wait(30)  # and goes without writing an entry

    sent: list[str] = []

    def fake_round_trip(request, deadline, cancel=None, on_baselines=None, kind="evaluate"):
        sent.append(kind)
        if kind == "evaluate_baselines":
            assert set(request) == {"config", "problem_source", "options"}
            return {"result": {"baselines": {"timings": {"eager": dict(TIMING, median_ms=2.0)}, "errors": {}},
                               "concurrency": {"span": [1.0, 2.0]}, "stage_seconds": {"baselines": 0.5}}}
        assert not request["want_baselines"]
        let_go.set()
        return {"result": {"status": Status.CORRECT, "reason": "", "concurrency": {},
                           "timings": {"candidate": dict(TIMING)}}}

    monkeypatch.setattr(ev, "_round_trip", fake_round_trip)
    thread = threading.Thread(target=other_holder)
    thread.start()
    assert holding.wait(10)
    result = ev.evaluate(PROBLEM, read(CANDIDATES / "relu_good.py"), config)
    thread.join(10)
    assert result.status == Status.CORRECT, result.reason
    assert sent == ["evaluate", "evaluate_baselines"]
    assert result.speedups == {"eager": 2.0} and "baseline_wait" in result.stage_seconds
    assert ev.cache.get(key)["timings"]["eager"]["median_ms"] == 2.0

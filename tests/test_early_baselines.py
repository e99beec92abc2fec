"""The baselines reach the caller before the evidence stage (issue 44: a sample waiting for another
sample's baselines also waited through that evaluation's Nsight Compute session, seconds a time).

The server sends `baselines_ready` with the job's nonce once the reference has timed them and
before the evidence; the caller stores the cache entry and lets go of the problem's claim at once.
"""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Pipe
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelagent.harness import Evaluator, EvalConfig, protocol
from kernelagent.harness.caller.channel import ServerChannel
from kernelagent.harness.result import Status

CANDIDATES = Path(__file__).parent / "candidates"
BASELINES = {"timings": {"eager": {"median_ms": 1.0, "q1_ms": 1.0, "q3_ms": 1.0, "min_ms": 1.0, "reps": 5,
                                   "meaningful": False, "note": ""}}, "errors": {}}


def _config() -> EvalConfig:
    return EvalConfig(trials=1, kernel_evidence=False)


@pytest.mark.parametrize("early", [True, False])
def test_the_claim_is_let_go_as_soon_as_the_baselines_are_stored(tmp_path, monkeypatch, early):
    ev = Evaluator(device="cpu", cache_dir=tmp_path)
    keys: list[str] = []
    real_put = ev.cache.put
    monkeypatch.setattr(ev.cache, "put", lambda key, entry: (keys.append(key), real_put(key, entry))[1])
    seen: dict = {}

    def fake_round_trip(request, deadline, cancel=None, on_baselines=None):
        assert request["want_baselines"]  # this evaluation holds the problem's claim
        if early:
            on_baselines(dict(BASELINES))
        key = keys[0] if keys else ev.cache.key(request_sha[0], ev._fingerprint, _config())
        with ev.cache.claim(key, wait_s=0) as free:  # what a second sample of the problem would find
            seen["claim_free"] = free
        seen["entry"] = ev.cache.get(key)
        return {"result": {"status": Status.RUNTIME_ERROR, "reason": "stand-in", "concurrency": {}}}

    from kernelagent.problem import load_problem

    request_sha = [load_problem(CANDIDATES / "relu_problem.py").sha256]
    monkeypatch.setattr(ev, "_round_trip", fake_round_trip)
    monkeypatch.setattr(ev, "start", lambda: None)
    ev._fingerprint = {"cuda": False}
    result = ev.evaluate(CANDIDATES / "relu_problem.py", (CANDIDATES / "relu_good.py").read_text(), _config())
    assert result.status == Status.RUNTIME_ERROR
    if early:
        assert seen["claim_free"] and seen["entry"]["timings"] == BASELINES["timings"]
    else:  # without them the claim is held through the whole round trip, as before
        assert not seen["claim_free"] and seen["entry"] is None


class _Channel(ServerChannel):
    """ServerChannel over one end of a pipe, without a server process."""

    def __init__(self, conn):
        self._conn, self._proc = conn, object()  # a server process stand-in: killed only on misbehaviour
        self._lock, self._send_lock = threading.Lock(), threading.Lock()
        self._pending, self._heard = {}, time.monotonic()
        self.killed: list[bool] = []

    def _kill_server(self, misbehaved: bool = False) -> None:
        self.killed.append(misbehaved)


def _fake_server(conn, forged: bool) -> None:
    request = protocol.recv(conn, {"evaluate"}, max_bytes=protocol.MAX_CALLER_FRAME)
    job = request["job"]
    protocol.send(conn, "started", job)
    nonce = protocol.recv(conn, {"nonce"}, job)["nonce"]
    protocol.send(conn, "baselines_ready", job, "forged" if forged else nonce, baselines=BASELINES)
    protocol.send(conn, "result", job, nonce, result={"status": Status.CORRECT})


@pytest.mark.parametrize("forged", [False, True])
def test_the_channel_hands_the_baselines_over_only_with_the_jobs_nonce(forged):
    caller_end, server_end = Pipe()
    channel = _Channel(caller_end)
    threading.Thread(target=channel._read, args=(caller_end,), daemon=True).start()
    server = threading.Thread(target=_fake_server, args=(server_end, forged), daemon=True)
    server.start()
    got: list[dict] = []
    request = {"config": {}, "problem_source": "", "candidate_source": "", "candidate_sha256": "",
               "want_baselines": True, "options": {}}
    reply = channel._round_trip(request, 10.0, None, got.append)
    server.join(5)
    if forged:
        assert "error" in reply and "nonce" in reply["error"] and channel.killed == [True] and got == []
    else:
        assert reply == {"result": {"status": Status.CORRECT}} and got == [BASELINES] and channel.killed == []


def test_the_server_announces_the_baselines_before_the_evidence(monkeypatch):
    """Job.finish_result: the baselines go out before evidence.collect, and only when the evidence
    runs (otherwise the result itself follows at once)."""
    from kernelagent.harness.server import evidence, job as job_mod
    from kernelagent.harness.server.job_record import JobRecord

    order: list[str] = []
    job = job_mod.Job.__new__(job_mod.Job)
    job.facts = JobRecord(status=Status.CORRECT, baselines=dict(BASELINES))
    job.request = {"want_baselines": False}
    job.config, job.fingerprint = EvalConfig(), {"cuda": True}  # no trace: Nsight Compute's stage
    job.on_baselines = lambda b: order.append("baselines")
    monkeypatch.setattr(job_mod.Job, "publish_build", lambda self: None)
    job.memory = SimpleNamespace(reference_stats=lambda: None)

    def collect(j):
        order.append("evidence")
        j.facts.evidence = {"kernels": []}

    monkeypatch.setattr(evidence, "collect", collect)
    monkeypatch.setattr(evidence, "discard", lambda j: order.append("discard"))
    monkeypatch.setattr(evidence, "wanted", lambda j: True)

    class Stop(Exception):
        pass

    def stop(self, job):  # what finish_result does after the evidence is not this test's
        raise Stop

    job.gate = type("G", (), {"unregister": stop})()
    with pytest.raises(Stop):
        job.finish_result()
    assert order == ["baselines", "evidence"]
    order.clear()
    monkeypatch.setattr(evidence, "wanted", lambda j: False)
    with pytest.raises(Stop):
        job.finish_result()
    assert order == ["discard"]

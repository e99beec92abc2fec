"""Evaluation cost, round 2 (issue 39): the mechanisms that cut an evaluation's wait and the
device slot's time, each tested so that it fails if the mechanism breaks.

- the timed loop's plan is reused by later jobs of a problem on a GPU, so its calibration is too,
  and a calibration is measured again at most once per loop there (server/timed.py);
- the kernel evidence's ncu session starts early, beside the job's checks, at most `max_early`
  at a time, and never beside an in-process profiler (server/profilers.py, server/evidence.py);
- the early session warms up with the slot taken but the other jobs running, and is profiled
  with them stopped (server/ncu.py NcuSession two_phase, gate.Hold.freeze);
- a waiting session gives up by itself when its scratch goes (child/ncu_entry.py);
- the speedup interval's bootstrap is vectorised and still reproducible (harness/stats.py);
- the harness names its processes, and benchmarks/host_cpu.py finds where the host's CPU goes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelagent.harness import EvalConfig
from kernelagent.harness.server import ncu as ncu_mod
from kernelagent.harness.server import gate as gate_mod
from kernelagent.harness.server.profilers import Profilers
from tests.test_admission import _Job
from kernelagent.harness.server.calibration import Calibration
from kernelagent.harness.server.timed import TimedLoop, loop_plan

ROOT = Path(__file__).resolve().parents[1]


# -- the loop's plan and its calibration ---------------------------------------------------------
def _timed_job(cuda: bool, gate: gate_mod.Gate, estimate_ms: float = 0.19, free: int = 80 << 30, *,
               fingerprint: dict | None = None, source: str = "P = 1\n") -> TimedLoop:
    """A job's timed loop, over what its plan reads of the job (seams.TimedJob)."""
    job = SimpleNamespace(config=EvalConfig(), fingerprint={**(fingerprint or {}), "cuda": cuda}, gate=gate,
                          problem_source=source,
                          ready={"estimate_ms": estimate_ms, "output_bytes": 64 << 20, "input_bytes": 64 << 20,
                                 "memory": {"free_bytes": free}})
    return TimedLoop(job)


def test_a_later_job_of_the_same_problem_runs_the_first_ones_loop_on_a_gpu():
    gate = gate_mod.Gate()
    settings = {"x": 1}
    first, reused = _timed_job(True, gate, 0.5).loop_plan(0.5, settings)
    assert not reused and first["total"] * 0.5 >= EvalConfig().target_ms
    # the reference's eager time differs by a few percent in the next job: same loop, reused
    again, reused = _timed_job(True, gate, 0.52).loop_plan(0.52, settings)
    assert reused and again == first
    fresh = loop_plan(EvalConfig(), 0.52, _timed_job(True, gate).harness_budget(), 64 << 20)
    assert fresh["total"] != first["total"]  # without the reuse the order (and its calibration key) differ
    # other settings: a plan of their own
    assert not _timed_job(True, gate).loop_plan(0.19, {"x": 2})[1]


@pytest.mark.parametrize("output_mib, estimate_ms, keep, segments", [
    (256, 0.13, 2, 128),   # the H200's softmax of level 1: the cap, 256 calls
    (256, 2.0, 2, 50),     # a slow kernel of the same size: its target, not the cap
    (16, 0.017, 10, 100),  # a 16 MiB ReLU: ten kept within the floor, 1,000 calls
    (1, 0.005, 125, 8),    # a tiny kernel: the least segments, many calls each
])
def test_a_loop_of_huge_outputs_runs_at_most_max_segments_round_trips(output_mib, estimate_ms, keep, segments):
    """Each segment is a round trip through the server (the candidate stopped, compared, let go):
    a 256 MiB output keeps 2 calls a segment, and its loop stops at MAX_SEGMENTS of them."""
    from kernelagent.harness.child import memory_plan
    from kernelagent.harness.server import timed

    output = output_mib << 20
    budget = memory_plan.harness_bytes(2 * output, 141 << 30)
    plan = loop_plan(EvalConfig(), estimate_ms, budget, output)
    assert timed.MAX_SEGMENTS == 128
    assert (plan["keep"], plan["segments"]) == (keep, segments)
    assert plan["calls"] * plan["segments"] <= plan["total"]


def test_the_plan_is_not_reused_on_the_cpu_or_when_memory_is_short():
    gate = gate_mod.Gate()
    _timed_job(False, gate).loop_plan(0.19, {})
    assert not _timed_job(False, gate).loop_plan(0.19, {})[1]  # the CPU: the candidate's own calls
    big = _timed_job(True, gate)
    big.loop_plan(0.19, {})
    short = _timed_job(True, gate, free=256 << 20)  # 30% of 256 MiB cannot hold the first job's kept outputs
    assert not short.loop_plan(0.19, {})[1]


def test_a_calibration_is_measured_again_at_most_once_per_loop_on_a_gpu():
    # an honest many-segment loop: its claim falls short of the server's time (per-segment costs)
    samples, measured, loop_s, calibration_s = [0.19] * 512, 512, 0.9, 0.4
    for cuda, second in ((True, False), (False, True)):
        gate = gate_mod.Gate()
        calibration = Calibration(SimpleNamespace(fingerprint={"cuda": cuda}, gate=gate))
        assert calibration.recalibration_wanted("k", samples, measured, loop_s, calibration_s)
        gate.recalibrated.add("k")  # what _timed_loop records after the second measure
        assert calibration.recalibration_wanted("k", samples, measured, loop_s, calibration_s) is second
        assert calibration.recalibration_wanted("other", samples, measured, loop_s, calibration_s)


# -- ncu sessions and in-process profilers ---------------------------------------------------------
def test_an_in_process_profile_waits_for_live_sessions_and_keeps_new_early_ones_out():
    p = Profilers(max_early=2)
    assert p.may_start()  # one early session, live
    order = []

    def profile():
        with p.in_process(None, timeout=10) as clear:
            order.append(("profiled", clear, p.live))

    t = threading.Thread(target=profile)
    t.start()
    time.sleep(0.3)
    assert not order  # waits while the session lives
    assert not p.may_start()  # and no new early one starts meanwhile
    p.ended(early=True)
    t.join(5)
    assert order == [("profiled", True, 0)]
    assert p.may_start() and p.may_start() and not p.may_start()  # the cap: two early at once


def test_a_profile_past_its_wait_is_skipped_not_run_beside_a_session():
    p = Profilers()
    assert p.may_start()
    started = time.monotonic()
    with p.in_process(None, timeout=0.3) as clear:
        assert clear is False
    assert 0.25 < time.monotonic() - started < 5
    assert p.in_process_users == 0  # let go


def test_a_late_session_waits_for_an_in_process_profile():
    p = Profilers()
    entered = threading.Event()
    release = threading.Event()
    seen = []

    def profile():
        with p.in_process(None, timeout=5):
            entered.set()
            release.wait(5)

    t = threading.Thread(target=profile)
    t.start()
    entered.wait(5)

    def late():
        with p.session(None, timeout=5) as clear:
            seen.append((clear, p.live))

    s = threading.Thread(target=late)
    s.start()
    time.sleep(0.3)
    assert not seen
    release.set()
    t.join(5)
    s.join(5)
    assert seen == [(True, 1)] and p.live == 0
    with p.in_process(None, timeout=5):
        with p.session(None, timeout=0.2) as clear:
            assert clear is False  # never beside it


def test_the_server_starts_at_most_the_cap_of_early_sessions_and_ends_each_once(tmp_path, monkeypatch):
    from kernelagent.harness.server import kernel_evidence
    from kernelagent.harness.server import evidence

    started, discarded = [], []

    class FakeEarly:
        setup = object()

        def discard(self):
            discarded.append(self)

    monkeypatch.setattr(kernel_evidence, "start", lambda *a, **k: started.append(k) or FakeEarly())
    monkeypatch.setattr(ncu_mod, "find_ncu", lambda: "/usr/bin/ncu")
    monkeypatch.setenv("KERNELAGENT_EVIDENCE_SPARES", "0")  # spares: the test below
    gate = SimpleNamespace(profilers=Profilers(max_early=2))

    def job(name, **over):
        root = tmp_path / name
        root.mkdir()
        j = SimpleNamespace(request={"options": {"evidence": {"hide": []}}, "problem_source": "P = 1\n",
                                     "candidate_source": "C = 1\n", "candidate_sha256": "x"},
                            config=EvalConfig(), fingerprint={"cuda": True}, jail={"mode": "namespaces"}, root=root,
                            limit=lambda stage: 60.0, gate=gate, early_evidence=None, early_counted=False)
        for k, v in over.items():
            setattr(j, k, v)
        return j

    a, b, c = job("a"), job("b"), job("c")
    for j in (a, b, c):
        evidence.start_early(j)
    assert a.early_evidence and b.early_evidence and c.early_evidence is None  # the cap
    assert started[0]["wait_s"] > 60 and started[0]["scratch_parent"] == a.root
    evidence.discard(a)
    evidence.discard(a)  # idempotent: counted down once
    assert gate.profilers.live == 1 and len(discarded) == 1
    evidence.start_early(c)  # the retry at the timing stage gets the freed place
    assert c.early_evidence is not None
    # none on the CPU, none when the caller did not ask, none for an asked-for profile
    for other in (job("d", fingerprint={"cuda": False}), job("e", config=EvalConfig(profile=True))):
        evidence.discard(b)
        evidence.start_early(other)
        assert other.early_evidence is None
    # the device share is judged from outside when the evidence runs, and only then
    assert evidence.covers_device_share(a)
    assert not evidence.covers_device_share(job("f", config=EvalConfig(kernel_evidence=False)))
    monkeypatch.setattr(ncu_mod, "find_ncu", lambda: None)
    assert not evidence.covers_device_share(a)


def test_the_next_job_of_a_problem_takes_over_a_spare_its_predecessor_started(tmp_path, monkeypatch):
    """A spare evidence session (server/evidence.py): started by a job for the next job of its
    problem, taken over by that job with its own candidate written in, never by a job of another
    problem or of the CUDA backend, ended when dead, for an in-process profile, or for a job's
    own session at the cap."""
    from kernelagent.harness.server import kernel_evidence
    from kernelagent.harness.server import evidence

    started = []

    class FakeEarly:
        def __init__(self, **k):
            self.k = k
            me = threading.current_thread()
            self.thread, self.thread_alive = me.name, me.is_alive
            self.setup = SimpleNamespace(scratch=tmp_path / f"s{len(started)}")
            self.setup.scratch.mkdir()
            self.alive = True
            self.session = SimpleNamespace(proc=SimpleNamespace(poll=lambda: None if self.alive else 0))
            self.discarded = 0
            self.spare = False

        def discard(self):
            self.discarded += 1

    def start(problem, candidate_source, **k):
        early = FakeEarly(candidate=candidate_source, problem=Path(problem).read_text(), **k)
        started.append(early)
        return early

    monkeypatch.setattr(kernel_evidence, "start", start)
    monkeypatch.setattr(ncu_mod, "find_ncu", lambda: "/usr/bin/ncu")
    gate = SimpleNamespace(profilers=Profilers(max_early=3))
    (tmp_path / "jobs").mkdir()

    def job(name, problem="P = 1\n", candidate="C = 1\n", backend="triton"):
        root = tmp_path / "jobs" / name
        root.mkdir()
        return SimpleNamespace(request={"options": {"evidence": {"hide": []}}, "problem_source": problem,
                                        "candidate_source": candidate, "candidate_sha256": "x"},
                               config=EvalConfig(backend=backend), fingerprint={"cuda": True},
                               jail={"mode": "namespaces"}, root=root, limit=lambda stage: 60.0, gate=gate,
                               early_evidence=None, early_counted=False)

    def start_early(j):
        # from a thread of its own, as a job's: the spare must not be started from it
        t = threading.Thread(target=evidence.start_early, args=(j,), name=f"job-{j.root.name}")
        t.start()
        t.join(10)
        evidence._spawner().submit(lambda: None).result(10)  # the spares' one thread has done its work

    a = job("a")
    start_early(a)
    own_a, spare = started
    # The spare's jail dies with the thread that started it (PR_SET_PDEATHSIG): never the job's,
    # which ends with the job; the spawner lives as long as the server.
    assert own_a.thread.startswith("job-") and not spare.thread.startswith("job-") and spare.thread_alive()
    assert a.early_evidence is own_a and own_a.k["scratch_parent"] == a.root and own_a.k["candidate"] == "C = 1\n"
    # the spare: the same problem, no candidate yet, in the server's scratch root, with a wait of its own
    assert spare.k["candidate"] == "" and spare.k["problem"] == "P = 1\n"
    assert spare.k["scratch_parent"] == a.root.parent and spare.k["wait_s"] == evidence.SPARE_WAIT_S
    assert gate.profilers.live == 2 and gate.profilers.has_spare(evidence.spare_key(a))

    b = job("b", candidate="B = 2\n")
    start_early(b)
    assert b.early_evidence is spare and spare.spare and spare.discarded == 0
    assert (spare.setup.scratch / "candidate.py").read_text() == "B = 2\n"  # its own candidate, written in
    assert len(started) == 3 and started[2].k["candidate"] == ""  # a spare for the job after b
    assert gate.profilers.live == 3  # a's, b's (the spare taken over), the new spare

    # another problem never takes this spare; at the cap, its own session takes the spare's place
    c = job("c", problem="Q = 2\n")
    start_early(c)
    assert c.early_evidence is started[3] and started[3].k["problem"] == "Q = 2\n"
    assert started[2].discarded == 1 and not gate.profilers.has_spare(evidence.spare_key(a))
    assert gate.profilers.live == 3  # a, b, c: no room for c's spare

    # each ends once, with its job
    for j in (a, b, c):
        evidence.discard(j)
    assert gate.profilers.live == 0 and spare.discarded == 1

    # a spare whose session ended (it waited past its wait) is not taken over
    d = job("d")
    start_early(d)
    left = started[-1]
    assert left.k["candidate"] == "" and gate.profilers.has_spare(evidence.spare_key(d))
    left.alive = False
    evidence.discard(d)
    e = job("e")
    start_early(e)
    assert e.early_evidence is not left and left.discarded == 1
    # an in-process profile ends the waiting spare at once (it would hold the device's profiler)
    assert gate.profilers.has_spare(evidence.spare_key(e))
    waiting = started[-1]
    evidence.discard(e)
    with gate.profilers.in_process(None, timeout=1) as clear:
        assert clear and waiting.discarded == 1
    assert gate.profilers.live == 0

    # the CUDA backend and KERNELAGENT_EVIDENCE_SPARES=0: no spare
    count = len(started)
    f = job("f", backend="cuda")
    start_early(f)
    assert evidence.spare_key(f) is None and len(started) == count + 1
    evidence.discard(f)
    monkeypatch.setenv("KERNELAGENT_EVIDENCE_SPARES", "0")
    g = job("g")
    start_early(g)
    assert evidence.spare_key(g) is None and len(started) == count + 2 and gate.profilers.live == 1


def test_an_audit_of_a_traced_job_starts_early_only_alone_and_never_keeps_a_spare(tmp_path, monkeypatch):
    """Where the trace is the evidence, ncu only audits (a win, the seeded share): its session starts
    beside the checks only for the server's one job (a lone evaluation waits for the profiled part
    only), else at the evidence stage, and no spare is kept for the problem's next job (an audit is
    a share: ncu's host process kept a core busy for as long as an early session or an untaken spare
    waited at READY, 196 of ncu's 250 CPU-s in one overlapped run). Where ncu is the evidence itself
    (evidence="ncu"), every job starts early and keeps a spare, loaded or not."""
    from kernelagent.harness.server import kernel_evidence
    from kernelagent.harness.server import evidence

    started = []

    class FakeEarly:
        def __init__(self, candidate):
            self.candidate = candidate
            self.setup = SimpleNamespace(scratch=tmp_path / f"s{len(started)}")
            self.setup.scratch.mkdir()
            self.session = SimpleNamespace(proc=SimpleNamespace(poll=lambda: None))
            self.spare = False

        def discard(self):
            pass

    def start(problem, candidate_source, **k):
        started.append(FakeEarly(candidate_source))
        return started[-1]

    monkeypatch.setattr(kernel_evidence, "start", start)
    monkeypatch.setattr(ncu_mod, "find_ncu", lambda: "/usr/bin/ncu")
    jobs_now = [1]
    gate = SimpleNamespace(profilers=Profilers(max_early=3), evaluations=lambda: jobs_now[0])
    (tmp_path / "jobs").mkdir()

    def job(name, audit=True, config=None, traced=True):
        root = tmp_path / "jobs" / name
        root.mkdir()
        return SimpleNamespace(request={"options": {"evidence": {"hide": [], "audit": audit}}, "problem_source": "P\n",
                                        "candidate_source": f"C = '{name}'\n", "candidate_sha256": "x"},
                               config=config or EvalConfig(), fingerprint={"cuda": True}, jail={"mode": "namespaces"},
                               root=root, limit=lambda stage: 60.0, gate=gate, early_evidence=None,
                               early_counted=False, trace_channel=object() if traced else None, trace=None)

    def start_early(j):
        evidence.start_early(j)
        evidence._spawner().submit(lambda: None).result(10)  # the spares' thread has done its work

    alone = job("alone")
    start_early(alone)
    assert alone.early_evidence is started[0] and started[0].candidate == "C = 'alone'\n"
    assert len(started) == 1 and not gate.profilers.spares  # no spare for an audit
    evidence.discard(alone)

    jobs_now[0] = 4  # the server runs others beside it: the audit starts at its evidence stage
    for name in ("loaded", "unaudited"):
        j = job(name, audit=name == "loaded")
        start_early(j)
        assert j.early_evidence is None
    assert len(started) == 1 and gate.profilers.live == 0
    unaudited_alone = job("unaudited-alone", audit=False)
    jobs_now[0] = 1
    start_early(unaudited_alone)
    assert unaudited_alone.early_evidence is None and len(started) == 1  # its trace is the evidence


    jobs_now[0] = 4
    for primary in (job("ncu", audit=False, config=EvalConfig(evidence="ncu")), job("untraced", traced=False)):
        start_early(primary)
        assert primary.early_evidence is not None and started[-1].candidate == ""  # its own, then a spare
        assert gate.profilers.has_spare(evidence.spare_key(primary))
        gate.profilers.drop_spares()
        evidence.discard(primary)


@pytest.mark.parametrize("beside, early", [
    ([], True),                                   # alone
    ([("baselines", True)], True),                # a cold eval: its problem's baselines compile beside it
    ([("baselines", True), ("b2", True)], True),  # two problems' baselines
    ([("other", False)], False),                  # another candidate's evaluation: under load
    ([("baselines", True), ("other", False)], False),
])
def test_an_audit_starts_beside_its_checks_when_it_is_the_one_evaluation_baselines_aside(beside, early):
    """Issue 59: a cold `eval` drawn for an audit had its problem's baselines registered beside it,
    so its session started at the evidence stage and its result waited for ncu's set-up (2.9 s of
    4.9 s on the H200, session 36). The gate counts the evaluations of candidates, and an audit
    of a traced job starts early wherever the job is the only one of those."""
    from kernelagent.harness.server import evidence

    gate = gate_mod.Gate(idle_wait_s=1.0)
    me = _Job("me")
    for registered in [me] + [_Job(name, baselines_only=b) for name, b in beside]:
        gate.register(registered)
    assert gate.active() == 1 + len(beside)
    assert gate.evaluations() == 1 + sum(not b for _, b in beside)
    job = SimpleNamespace(gate=gate, config=EvalConfig(), fingerprint={"cuda": True}, trace_channel=object(),
                          request={"options": {"evidence": {"audit": True}}})
    assert evidence.asked(job)
    assert evidence.starts_early(job) is early
    job.request = {"options": {"evidence": {"audit": False}}}  # not audited: its trace is the evidence
    assert evidence.starts_early(job) is False


def test_a_session_started_at_the_evidence_stage_runs_in_two_phases_in_the_slot(tmp_path, monkeypatch):
    """An audit under load (no early session): the session starts at the evidence stage, is let go
    holding the timing slot with the other jobs running on (its warm-up), as an early one is, and
    its phases say it started late."""
    from kernelagent.harness.server import kernel_evidence
    from kernelagent.harness.server import evidence

    holds, collected = [], []

    class FakeEarly:
        def collect(self, **k):
            collected.append(k)
            with k["on_ready"]():
                pass
            return {"kernels": [], "phases": {"early": True, "to_ready_s": 4.0}}

        def discard(self):
            pass

    starts = []
    monkeypatch.setattr(kernel_evidence, "start", lambda problem, source, **k: starts.append((source, k)) or FakeEarly())
    from contextlib import contextmanager

    @contextmanager
    def hold(job, probe, stats, freeze=True):
        holds.append(freeze)
        yield SimpleNamespace()

    gate = SimpleNamespace(profilers=Profilers(max_early=3), active=lambda: 4, hold=hold)
    root = tmp_path / "job"
    root.mkdir()
    stages = []
    j = SimpleNamespace(request={"options": {"evidence": {"hide": [], "audit": True}}, "problem_source": "P\n",
                                 "candidate_source": "C\n", "candidate_sha256": "x"},
                        config=EvalConfig(), fingerprint={"cuda": True}, jail={"mode": "namespaces"}, root=root,
                        limit=lambda stage: 60.0, gate=gate, early_evidence=None, early_counted=False,
                        trace_channel=object(), trace=None, enter=stages.append, idle_probe=None, concurrency={},
                        cpu={}, facts=SimpleNamespace(evidence=None))
    evidence.collect(j)
    assert [s for s, _ in starts] == ["C\n"] and starts[0][1]["scratch_parent"] == root
    assert holds == [False]  # the slot, the others running on while it warms up (then frozen: ncu_session)
    assert j.facts.evidence["phases"]["early"] is False and stages == ["evidence", "finished"]
    assert "unavailable" not in j.facts.evidence and j.facts.evidence["ncu_lock"] in ("device", "host")
    assert gate.profilers.live == 0  # counted while it ran, and no more


# -- the session's two phases ------------------------------------------------------------------------
TWO_PHASE = ('[ -n "$KERNELAGENT_NCU_TWO_PHASE" ] || exit 9; echo KERNELAGENT_NCU_READY; '
             'while [ ! -e kernelagent-go ]; do sleep 0.01; done; '
             'echo "KERNELAGENT_NCU_T first $(cat /proc/uptime | cut -d" " -f1)"; '
             'sleep 0.5; echo KERNELAGENT_NCU_WARMED; '
             'while [ ! -e kernelagent-go2 ]; do sleep 0.01; done; sleep 0.3; echo "KERNELAGENT_NCU_DONE {}"')


class _Hold:
    def __init__(self, cwd: Path, events: list):
        self.cwd, self.events = cwd, events

    def freeze(self):
        self.events.append(("freeze", (self.cwd / "kernelagent-go2").exists(), time.monotonic()))


def test_an_early_session_warms_up_unfrozen_and_is_profiled_frozen(tmp_path):
    events: list = []

    @contextlib.contextmanager
    def slot():
        events.append(("enter", (tmp_path / "kernelagent-go").exists(), time.monotonic()))
        yield _Hold(tmp_path, events)
        events.append(("exit", None, time.monotonic()))

    session = ncu_mod.NcuSession(["sh", "-c", TWO_PHASE], tmp_path, dict(os.environ), handshake=True, two_phase=True)
    assert session.ready.wait(10)  # started at once, waiting at READY before run() is called
    proc = session.run(30, slot)
    assert proc is not None and "KERNELAGENT_NCU_DONE" in proc.stdout, proc
    kinds = [e[0] for e in events]
    assert kinds == ["enter", "freeze", "exit"], events
    assert events[0][1] is False and events[1][1] is False  # go only after the slot; go2 only after the freeze
    assert events[1][2] - events[0][2] >= 0.45  # its warm-up ran before the others were stopped
    assert proc.phases["warm_s"] >= 0.45 and proc.phases["profiled_s"] >= 0.75
    assert "target_first_s" in proc.phases  # the target's progress lines, parsed


def test_one_phase_sessions_never_ask_for_the_freeze(tmp_path):
    events: list = []

    @contextlib.contextmanager
    def slot():
        yield _Hold(tmp_path, events)

    script = 'echo KERNELAGENT_NCU_READY; while [ ! -e kernelagent-go ]; do sleep 0.01; done; echo KERNELAGENT_NCU_DONE'
    proc = ncu_mod.NcuSession(["sh", "-c", script], tmp_path, dict(os.environ), handshake=True).run(30, slot)
    assert proc is not None and events == [] and "warm_s" not in proc.phases


def test_a_discarded_early_session_is_killed_and_its_scratch_removed(tmp_path):
    from kernelagent.harness.server.kernel_evidence import Early

    outer = tmp_path / "outer"
    (outer / "job").mkdir(parents=True)
    setup = ncu_mod.Setup("ncu", outer, outer / "job", dict(os.environ), [], [])
    session = ncu_mod.NcuSession(["sh", "-c", "echo KERNELAGENT_NCU_READY; sleep 60"], outer / "job",
                                 dict(os.environ), handshake=True)
    assert session.ready.wait(10)
    early = Early(setup, session)
    early.discard()
    assert session.proc.poll() is not None and not outer.exists()
    early.discard()  # again: nothing left to do
    assert "could not" in Early(unavailable="could not start").collect(
        timeout=1, on_ready=None, lock_wait_s=1, triton_cache=None, cache_dir=None, candidate_sha="",
        backend="triton", run_as=None)["unavailable"]


def _waiting_target(cwd: Path, wait_s: str = "60") -> subprocess.Popen:
    code = ("import os, sys; sys.path.insert(0, %r); os.chdir(%r)\n"
            "from kernelagent.harness.child import ncu_entry\nncu_entry._wait_for('kernelagent-go')\nprint('went')"
            % (str(ROOT), str(cwd)))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, KERNELAGENT_NCU_WAIT_S=wait_s))


def test_a_waiting_target_gives_up_when_its_scratch_is_removed(tmp_path):
    import shutil

    cwd = tmp_path / "scratch"
    cwd.mkdir()
    proc = _waiting_target(cwd)
    time.sleep(1.0)
    assert proc.poll() is None  # waiting for the go
    shutil.rmtree(cwd)
    assert proc.wait(10) == 3 and "ABANDONED" in proc.stdout.read()


def test_a_finished_target_ends_at_once_its_output_flushed_and_no_teardown_run():
    """The audit holds the device until its session has ended, so the target skips Python's and
    the libraries' teardown (CUDA's context, 0.25 s on an H200): what it printed still reaches
    ncu's pipe, no exit handler runs, and its code is the one `main` returned."""
    import ast

    code = ("import atexit, sys; sys.path.insert(0, %r)\n"
            "from kernelagent.harness.child import ncu_entry\n"
            "atexit.register(lambda: print('TEARDOWN'))\n"
            "sys.stdout.write('KERNELAGENT_NCU_DONE {}')\n"
            "ncu_entry._exit_done(5)\n" % str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 5 and proc.stdout == "KERNELAGENT_NCU_DONE {}", proc.stdout
    # and a finished session's target ends through it (an unfinished one through C's exit())
    tree = ast.parse((ROOT / "kernelagent/harness/child/ncu_entry.py").read_text())
    guard = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert [ast.unparse(s) for s in guard[0].body] == ["_exit_done(main(sys.argv[1:]))"]


def test_a_waiting_target_gives_up_after_its_wait_and_goes_on_a_go(tmp_path):
    proc = _waiting_target(tmp_path, wait_s="1")
    assert proc.wait(15) == 3
    proc = _waiting_target(tmp_path)
    time.sleep(0.5)
    (tmp_path / "kernelagent-go").touch()
    assert proc.wait(15) == 0 and "went" in proc.stdout.read()


# -- the bootstrap ---------------------------------------------------------------------------------------
def test_the_vectorised_bootstrap_agrees_with_the_pure_python_one_and_is_reproducible(monkeypatch):
    import builtins
    import random

    from kernelagent.harness import stats

    rng = random.Random(7)
    base = [1.0 + 0.05 * rng.random() for _ in range(300)]
    cand = [0.8 + 0.05 * rng.random() for _ in range(300)]
    fast = stats.speedup_interval(base, cand)
    assert fast == stats.speedup_interval(base, cand)  # the same samples, the same interval
    real_import = builtins.__import__

    def no_numpy(name, *args, **kwargs):
        if name == "numpy":
            raise ImportError("no numpy here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numpy)
    slow = stats.speedup_interval(base, cand)
    assert slow == stats.speedup_interval(base, cand)
    assert slow != fast  # two generators: the fallback really ran
    for a, b in zip(fast, slow):
        assert abs(a - b) / b < 0.01


# -- where the CPU goes ---------------------------------------------------------------------------------
def test_host_cpu_attributes_a_childs_cpu_to_its_kind():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from host_cpu import HostCpu, classify

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
    with HostCpu(interval=0.05) as cpu:
        subprocess.run([sys.executable, "-c", burn], check=True)
    rep = cpu.report(evaluations=1, tree=True)
    assert rep["by_kind"]["other"]["cpu_s"] >= 0.4, rep["by_kind"]
    assert rep["machine_cpu_s"] >= 0.4 and rep["reaped_cpu_s"] >= 0.4
    assert classify("ka-reference", "") == "reference" and classify("ncu", "") == "ncu"
    assert classify("python3", "python3 -m kernelagent.harness.child.ncu_entry p c triton 2") == "ncu-target"
    assert classify("cc1", "") == "toolchain"


def test_the_harness_names_its_processes(tmp_path):
    """ka-server, ka-reference and ka-candidate: what benchmarks/host_cpu.py sorts the host's CPU by."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from host_cpu import HostCpu

    from kernelagent.harness import Evaluator
    from tests.conftest import CANDIDATES, read

    with HostCpu(interval=0.05) as cpu:
        with Evaluator(device="cpu", cache_dir=tmp_path / "cache") as ev:
            result = ev.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"),
                                 EvalConfig(trials=1, baselines=False))
    assert result.status == "correct", result.reason
    kinds = cpu.report()["by_kind"]
    assert {"server", "reference", "candidate"} <= set(kinds), kinds


# -- the benchmarks' reports --------------------------------------------------------------------------
def test_the_overlap_benchmark_reports_the_slot_and_the_hosts_cpu(tmp_path):
    """benchmarks/overlap.py's rows and totals (on the CPU its times are not meaningful): the
    slot's parts with the evidence's own hold, host CPU-seconds per evaluation, the calibration's
    reuse per row."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import overlap

    from tests.conftest import CANDIDATES, read

    jobs = [("relu#0", CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"))]
    out = overlap.run_mode("cpu", tmp_path / "cache", jobs, EvalConfig(trials=1, baselines=False), 1)
    assert out["evaluations"] == 1 and out["rows"][0]["status"] == "correct"
    assert out["host_cpu_s"] > 0 and out["host_cpu_s_per_evaluation"] == pytest.approx(out["host_cpu_s"], abs=0.011)
    assert "evidence" in out["slot_parts_s"] and "calibration" in out["slot_parts_s"]
    row = out["rows"][0]
    assert {"evidence_held_s", "evidence_phases", "server_cpu_s", "calibration"} <= set(row)


@pytest.mark.parametrize("median, want", [
    (0.1355, True),    # the H200 run: beside spinners 0.1355 ms, its serial twin 0.1370, the copies 0.1341-0.1370
    (0.1341, True),    # at the range's ends
    (0.1370, True),
    (0.1330, False),   # faster than every copy alone
    (0.1400, False),   # slower than every copy alone
    (None, None),      # no median beside the spinners
])
def test_the_spinner_check_judges_against_the_serial_copies_range(median, want):
    """benchmarks/overlap.py: the spinner row's median against the spread of the same candidate's
    serial copies (every `key#i`, other candidates not counted)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import overlap

    rows = [{"key": "level1/1_relu#0", "median_ms": 0.1370}, {"key": "level1/1_relu#1", "median_ms": 0.1341},
            {"key": "level1/1_relu#2", "median_ms": 0.1352}, {"key": "level1/2_gelu#0", "median_ms": 0.2},
            {"key": "level1/1_relu#3", "median_ms": None}]
    copies = overlap.serial_copies(rows, "level1/1_relu#0")
    assert copies == [0.1341, 0.1352, 0.1370]
    assert overlap.within_copies(copies, median) is want
    assert overlap.within_copies(copies[:1], 0.1370) is None  # one copy: no spread to judge against


def test_the_spinner_check_reads_the_device_clock_beside_the_wall_clock():
    """The H200's relu beside two spinners read +1.8% on the wall clock, outside its serial copies'
    range, while the same kernel's wall clock moved as much with no neighbour at all: the row also
    gives each job's device time per call (the kernel trace) and judges the copies' range on it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import overlap

    from kernelagent.harness.result import CallClock, EvalResult, Timing

    traced = EvalResult(status="correct", timings={"candidate": Timing(0.1368, 0.1368, 0.1368, 0.1368, 5)},
                        per_call=CallClock.of(device_ms=0.1330, wall_ms=0.1368, source="trace"))
    untraced = EvalResult(status="correct", timings={"candidate": Timing(0.1344, 0.1344, 0.1344, 0.1344, 5)})
    assert overlap._row("level1/1_relu#0", traced)["device_ms"] == 0.1330
    assert overlap._row("level1/1_relu#1", untraced)["device_ms"] is None
    rows = [{"key": "level1/1_relu#0", "median_ms": 0.1344, "device_ms": 0.1331},
            {"key": "level1/1_relu#1", "median_ms": 0.1348, "device_ms": 0.1329},
            {"key": "level1/1_relu#2", "median_ms": 0.1343, "device_ms": None}]
    wall, device = overlap.serial_copies(rows, "level1/1_relu#0"), overlap.serial_copies(rows, "level1/1_relu#0",
                                                                                          "device_ms")
    assert wall == [0.1343, 0.1344, 0.1348] and device == [0.1329, 0.1331]
    assert overlap.within_copies(wall, 0.1368) is False and overlap.within_copies(device, 0.1330) is True


# -- Triton's per-process set-up, before a candidate's first call ------------------------------------
def test_triton_warm_computes_the_cache_key_once_for_the_process():
    """child/triton_warm.py: the hash of Triton's installation (0.44 s of a first call on an
    H100) is computed by our code, and the candidate's first call finds it cached."""
    pytest.importorskip("triton")
    from triton.runtime.cache import triton_key

    from kernelagent.harness.child import triton_warm

    code = ("import sys, time; from triton.runtime.cache import triton_key; "
            "from kernelagent.harness.child import triton_warm; "
            "assert triton_key.cache_info().currsize == 0; took = triton_warm.warm(); "
            "assert triton_key.cache_info().currsize == 1 and took > 0, took; "
            "t = time.monotonic(); triton_warm.warm(); print(round(time.monotonic() - t, 4))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip()) < 0.05  # the second time: cached in the process
    assert callable(triton_key) and callable(triton_warm.warm)


def _calls_in_order(path: Path, function: str) -> list[str]:
    import ast

    tree = ast.parse(path.read_text())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = [n for n in ast.walk(body) if isinstance(n, ast.Call)]
    return [ast.unparse(c.func) for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def test_the_evidence_target_warms_triton_before_it_says_ready_and_the_gpu_server_before_jobs():
    """The warm-up must run in our code: in the evidence's target before READY (after it, the
    candidate's part holds the device's slot), in a GPU server before it serves (jobs fork from it)."""
    root = Path(__file__).resolve().parents[1] / "kernelagent" / "harness"
    calls = _calls_in_order(root / "child" / "ncu_entry.py", "main")
    assert "triton_warm.warm" in calls and calls.index("triton_warm.warm") < calls.index("_wait_for_the_device")
    import ast

    tree = ast.parse((root / "server" / "main.py").read_text())
    serve, warm_up = (next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
                      for name in ("serve", "_import_once"))
    guarded = [n for n in ast.walk(warm_up) if isinstance(n, ast.If) and ast.unparse(n.test) == "expects_cuda"]
    assert any("triton_warm.warm()" in ast.unparse(n) for n in guarded)  # on a GPU only
    warm_line = next(n.lineno for n in ast.walk(serve) if isinstance(n, ast.Call)
                     and ast.unparse(n.func) == "_import_once")
    serve_line = min(n.lineno for n in ast.walk(serve) if isinstance(n, ast.Call)
                     and ast.unparse(n.func) in ("Dispatcher",))
    assert warm_line < serve_line

"""Several jobs at once on one device (issue 23): host work overlaps, timed phases never do.

On the CPU the server still runs jobs concurrently and still serialises every timed phase
through its gate (server/gate.py); these tests read the intervals the server reports
(`result.concurrency["span"]` and `["held"]`, epoch seconds) and the gate's own units.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kernelagent.harness import EvalConfig, Evaluator, StageTimeouts, Status
from kernelagent.harness.server.admission import Admission
from kernelagent.harness.server.gate import Gate, MemoryLedger, default_concurrency
from tests.conftest import CANDIDATES, TESTS, read

# One worker for the file (pytest-xdist): its module fixtures (its evaluator) are made once.
pytestmark = pytest.mark.xdist_group("concurrency")

SPINNER = TESTS / "adversarial" / "n1_spinner_neighbour.py"


def _config() -> EvalConfig:
    return EvalConfig(trials=2, target_ms=20, warmup_ms=5, max_reps=20, derived_checks=0,
                      timeouts=StageTimeouts(start=60, load=60, compile=90, correctness=90, timing=60))


@pytest.fixture(scope="module")
def concurrent_evaluator(tmp_path_factory):
    with Evaluator(device="cpu", cache_dir=tmp_path_factory.mktemp("conc-cache"), concurrency=3) as ev:
        yield ev


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_host_stages_overlap_and_timed_phases_do_not(concurrent_evaluator):
    problem = CANDIDATES / "relu_problem.py"
    jobs = [(problem, f"# copy {i}\n" + read(CANDIDATES / "relu_good.py"), _config()) for i in range(3)]
    results = concurrent_evaluator.map(jobs)
    assert [r.status for r in results] == [Status.CORRECT] * 3, [r.reason for r in results]
    assert concurrent_evaluator.concurrency["jobs"] == 3
    spans = [r.concurrency["span"] for r in results]
    assert any(_overlap(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]), spans
    assert all(r.concurrency["shared_device"] for r in results)
    held = [h for r in results for h in r.concurrency["held"]]
    assert len(held) >= 3  # every job held the slot for its loop at least
    held.sort()
    for first, second in zip(held, held[1:]):
        assert first[1] <= second[0] + 1e-3, f"two timed phases overlapped: {first} {second}"
    # Where the slot's time went (gate.SLOT_PARTS): every part measured inside the holds, so
    # together they never exceed held_s; the clocked loop and the warm-up are always there.
    from kernelagent.harness.server.gate import SLOT_PARTS

    for r in results:
        parts = {k: r.concurrency.get(k, 0.0) for k in SLOT_PARTS}
        assert parts["slot_loop_s"] > 0 and parts["slot_warmup_s"] > 0, r.concurrency
        assert r.concurrency["slot_freeze_s"] >= 0 and "slot_thaw_s" in r.concurrency
        assert sum(parts.values()) <= r.concurrency["held_s"] + 1e-3, (parts, r.concurrency["held_s"])
    assert sum(r.concurrency.get("slot_calibration_s", 0.0) for r in results) > 0  # the first job calibrated


def test_asked_for_profiling_holds_the_slot_like_a_timed_loop(concurrent_evaluator):
    """The profiled calls are a second clock on the candidate's kernels (profiling.clocks): beside
    a neighbour's work they read 6-11% slow on an H200, so they run in the slot, alone."""
    problem = CANDIDATES / "relu_problem.py"
    config = EvalConfig(trials=2, target_ms=20, warmup_ms=5, max_reps=20, derived_checks=0, profile=True,
                        timeouts=StageTimeouts(start=60, load=60, compile=90, correctness=90, timing=60))
    jobs = [(problem, f"# profiled copy {i}\n" + read(CANDIDATES / "relu_good.py"), config) for i in range(3)]
    results = concurrent_evaluator.map(jobs)
    assert [r.status for r in results] == [Status.CORRECT] * 3, [r.reason for r in results]
    profiled = [r.concurrency["profile_slot"]["held"] for r in results]
    assert all(len(h) == 1 for h in profiled), profiled
    assert all(r.kernels for r in results)  # the profile ran inside the slot
    held = sorted([h for r in results for h in r.concurrency["held"]] + [h[0] for h in profiled])
    for first, second in zip(held, held[1:]):
        assert first[1] <= second[0] + 1e-3, f"a profile overlapped another slot holder: {first} {second}"


def test_hostile_spinner_neighbour_is_stopped_while_another_job_times(concurrent_evaluator):
    problem = CANDIDATES / "relu_problem.py"
    jobs = [(problem, read(SPINNER), _config()),
            (problem, "# honest\n" + read(CANDIDATES / "relu_good.py"), _config())]
    spinner, honest = concurrent_evaluator.map(jobs)
    assert honest.status == Status.CORRECT, honest.reason
    held = sorted(h for r in (spinner, honest) for h in r.concurrency.get("held", []))
    for first, second in zip(held, held[1:]):
        assert first[1] <= second[0] + 1e-3
    # The spinner burned a core from import on; while the honest job held the slot it was
    # stopped, so the server's clock and the claim still agree (no clock-mismatch, no tampering).
    kinds = {f.kind for f in honest.flags}
    assert "tampering" not in kinds and "clock-mismatch" not in kinds, honest.flags


def test_a_hung_job_does_not_block_the_others(tmp_path):
    config = EvalConfig(trials=1, target_ms=10, warmup_ms=2, max_reps=10, derived_checks=0,
                        timeouts=StageTimeouts(start=60, load=60, compile=4, correctness=60, timing=60))
    problem = CANDIDATES / "relu_problem.py"
    with Evaluator(device="cpu", cache_dir=tmp_path, concurrency=2) as ev:
        ev.fingerprint()
        started = time.monotonic()
        hung, good = ev.map([(problem, read(CANDIDATES / "hangs.py"), config),
                             (problem, read(CANDIDATES / "relu_good.py"), config)])
        wall = time.monotonic() - started
    assert good.status == Status.CORRECT, good.reason
    assert hung.status == Status.TIMEOUT, hung.reason
    assert good.stage_seconds["total"] < hung.stage_seconds["total"] + 30
    assert wall < 120


class _FakeJob:
    def __init__(self, name: str):
        self.job_id = name
        self.frozen: list[bool] = []
        self.paused = 0

    def freeze(self, stop: bool) -> None:
        self.frozen.append(stop)

    def freeze_candidate(self, stop: bool) -> None:
        pass

    def pause_clock(self, paused: bool) -> None:
        self.paused += 1 if paused else -1


def test_gate_stops_every_other_job_and_waits_for_idle():
    gate = Gate(idle_wait_s=5)
    a, b, c = _FakeJob("a"), _FakeJob("b"), _FakeJob("c")
    for job in (a, b, c):
        gate.register(job)
    reads = iter([False, False, True, True])
    stats: dict = {}
    with gate.hold(a, probe=lambda: next(reads), stats=stats) as hold:
        assert b.frozen == [True] and c.frozen == [True] and a.frozen == []
        assert b.paused == 1 and c.paused == 1  # their stage clocks stop while a times
        assert hold.wait_idle()
    assert b.frozen == [True, False] and c.frozen == [True, False]
    assert b.paused == 0 and a.paused == 0
    assert stats["idle_wait_s"] > 0 and len(stats["held"]) == 1
    assert gate.unregister(a) is True  # it shared the device


def test_gate_gives_up_on_a_device_that_never_goes_idle():
    gate = Gate(idle_wait_s=0.2)
    a = _FakeJob("a")
    gate.register(a)
    with gate.hold(a, probe=lambda: False) as hold:
        assert hold.busy
    assert gate.unregister(a) is False


def test_the_gate_waits_for_quiet_memory_bandwidth_too(monkeypatch):
    """Memory a process gives back is cleared by the driver in the background, and that took
    bandwidth from the next kernels (a 4.29 ms ReLU read 4.98 ms for ~25 ms after 13 GB were freed
    on an H100) while the spin probe read idle: a probe's (idle, quiet) pair waits for both."""
    from kernelagent.harness.server import gate as gate_mod

    gate = Gate(idle_wait_s=5)
    a = _FakeJob("a")
    gate.register(a)
    reads = iter([(False, False), (True, False), (True, False), (True, True)])
    seen = []

    def probe():
        seen.append(1)
        return next(reads)

    stats: dict = {}
    with gate.hold(a, probe=probe, stats=stats) as hold:
        assert not hold.busy
    assert len(seen) == 4  # the idle spin alone was not enough
    assert stats["bandwidth_wait_s"] > 0 and not stats.get("bandwidth_busy")
    # A device that stays slow for good (its clocks) is no neighbour's work: the wait for quiet
    # bandwidth ends after BANDWIDTH_WAIT_S and is recorded, never flagged device-busy.
    monkeypatch.setattr(gate_mod, "BANDWIDTH_WAIT_S", 0.05)
    stats = {}
    with gate.hold(a, probe=lambda: (True, False), stats=stats) as hold:
        assert not hold.busy
    assert stats["bandwidth_busy"] is True and stats["bandwidth_wait_s"] >= 0.05
    # A plain bool still works (no bandwidth reading).
    with gate.hold(a, probe=lambda: True, stats={}) as hold:
        assert not hold.busy


def test_bandwidth_is_quiet_within_its_slack_of_the_recent_least():
    from kernelagent.harness.server.gate import BANDWIDTH_SLACK, Bandwidth

    bw = Bandwidth()
    assert bw.quiet(None) and bw.quiet(0.0)  # no reading: nothing to wait for
    assert bw.quiet(83.0)
    assert bw.quiet(83.0 * (BANDWIDTH_SLACK - 0.01))
    assert not bw.quiet(96.0)  # 1.16x: memory being cleared (H100, 2026-11-27)
    # the least is over a window: a device that became slower for good becomes the new normal
    for _ in range(Bandwidth.WINDOW):
        bw.quiet(100.0)
    assert bw.quiet(100.0) and not bw.quiet(120.0)


def test_holds_are_exclusive_between_threads():
    gate = Gate()
    jobs = [_FakeJob(str(i)) for i in range(4)]
    for job in jobs:
        gate.register(job)
    inside: list[int] = []
    worst = [0]

    def hold(job):
        for _ in range(5):
            with gate.hold(job):
                inside.append(1)
                worst[0] = max(worst[0], len(inside))
                time.sleep(0.002)
                inside.pop()

    threads = [threading.Thread(target=hold, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert worst[0] == 1 and len(gate.history) == 20


def test_admission_limits_and_alone():
    admission = Admission(2)
    running: list[str] = []
    log: list[tuple[str, int, bool]] = []
    lock = threading.Lock()

    def job(name: str, alone: bool):
        with admission.admit(alone=alone):
            with lock:
                running.append(name)
                log.append((name, len(running), "alone" in running))
            time.sleep(0.05)
            with lock:
                running.remove(name)

    threads = [threading.Thread(target=job, args=(f"j{i}", False)) for i in range(4)]
    threads.append(threading.Thread(target=job, args=("alone", True)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(n for _, n, _ in log) <= 2
    assert [n for name, n, _ in log if name == "alone"] == [1]
    assert not any(has_alone and name != "alone" for name, _, has_alone in log)


def test_memory_ledger_waits_for_room():
    ledger = MemoryLedger(10)
    job = _FakeJob("x")
    order = []
    with ledger.reserve(job, 6):
        t = threading.Thread(target=lambda: (ledger.reserve(job, 6).__enter__(), order.append("second")))
        t.start()
        time.sleep(0.1)
        order.append("first done")
    t.join(2)
    assert order == ["first done", "second"]


def test_default_concurrency_is_bounded_by_cpus_and_memory():
    assert default_concurrency(cpus=16, device_free_bytes=79 << 30)[0] == 8
    assert default_concurrency(cpus=16, device_free_bytes=10 << 30)[0] == 2
    assert default_concurrency(cpus=2, cuda=False)[0] == 1


def _decided(job, status, reason):
    """A job whose verdict so far is `status`, recorded as a job records it (harness/verdict.py)."""
    from kernelagent.harness.server.job_record import JobRecord
    from kernelagent.harness.verdict import Concluded

    job.outcomes, job.facts = [], JobRecord()
    job.record(Concluded(status, reason, None))


def test_out_of_memory_beside_others_is_retried_alone(tmp_path, monkeypatch):
    """The rule (server/job.py conclude_concurrency): an out-of-memory error in a job that shared
    the device is a harness error with retry_alone, and the caller re-runs it alone."""
    from kernelagent.harness.server import job as job_mod

    job = job_mod.Job.__new__(job_mod.Job)
    job.concurrency, job.alone, job.out_of_memory, job.shared_device = {}, False, True, True
    job.stage_timed_out, job.alloc_retries = False, {}
    _decided(job, Status.RUNTIME_ERROR, "out of memory on the device")
    job.conclude_concurrency()
    assert job.facts.status == Status.HARNESS_ERROR and job.facts.concurrency["retry_alone"]
    job.alone = True
    _decided(job, Status.RUNTIME_ERROR, "out of memory on the device")
    job.conclude_concurrency()
    assert job.facts.status == Status.RUNTIME_ERROR  # alone, it is the candidate's
    # The reference out of memory building the problem beside others (level1/25_Swish with 3.3
    # GiB left by its neighbours on an H100): too_large only once it ran alone.
    job.alone = False
    _decided(job, Status.TOO_LARGE, "the reference ran out of device memory")
    job.conclude_concurrency()
    assert job.facts.status == Status.HARNESS_ERROR and job.facts.concurrency["retry_alone"]
    job.alone = True
    _decided(job, Status.TOO_LARGE, "the reference ran out of device memory")
    job.conclude_concurrency()
    assert job.facts.status == Status.TOO_LARGE
    # The caller's side: a retry_alone reply is sent again with options.alone.
    sent = []
    ev = Evaluator(device="cpu", cache_dir=tmp_path)
    first_reason = "ran past a stage limit while other evaluations shared the host (was: \x1b[2J" + "x" * 900 + ")"
    replies = iter([{"result": {"status": Status.HARNESS_ERROR, "stage": "start", "reason": first_reason,
                                "stage_seconds": {"start": 60.2, "total_server": 61.4, "bogus": float("nan"),
                                                  "flag": True},
                                "concurrency": {"retry_alone": True, "wait_s": 1.5, "memory_wait_s": float("inf"),
                                                "at_limit": {"candidate": ["812 python3 T do_signal_stop\x1b[31m"],
                                                             "reference": "not a list",
                                                             "candidate_stack": "File \"x.py\", line 3\x1b[2J"
                                                                                + "y" * 4000}}}},
                    {"result": {"status": Status.RUNTIME_ERROR, "reason": "oom alone", "concurrency": {}}}])

    def fake_round_trip(request, deadline, cancel=None, on_baselines=None):
        sent.append(dict(request["options"]))
        return next(replies)

    monkeypatch.setattr(ev, "_round_trip", fake_round_trip)
    monkeypatch.setattr(ev, "start", lambda: None)
    ev._fingerprint = {"cuda": False}
    result = ev.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), _config())
    assert [o.get("alone") for o in sent] == [None, True]
    assert result.status == Status.RUNTIME_ERROR and result.concurrency["retried_alone"]
    # What the first try met stays in the result: its stage, its reason (cut, terminal sequences
    # removed) and its stage clocks (numbers only), beside the seconds it cost.
    first = result.concurrency["first_try"]
    assert first["status"] == Status.HARNESS_ERROR and first["stage"] == "start"
    assert first["reason"].startswith("ran past a stage limit") and "\x1b" not in first["reason"]
    assert len(first["reason"]) == 300
    assert first["stage_seconds"] == {"start": 60.2, "total_server": 61.4}
    assert first["concurrency"] == {"wait_s": 1.5}  # numbers only: no flags, no infinities
    stack = first["at_limit"].pop("candidate_stack")  # the start's stack dump: cut, sequences removed
    assert stack.startswith('File "x.py", line 3yyy') and len(stack) == 3000
    assert first["at_limit"] == {"candidate": ["812 python3 T do_signal_stop"]}
    assert result.stage_seconds["first_try"] == 61.4


def test_a_full_device_while_timed_beside_others_is_retried_alone():
    """The caching allocator gave memory back while the candidate's loop or profile, or a
    baseline, was timed beside other jobs (common.AllocPressure): the times are not the kernel's
    alone, so a correct result is a harness error with retry_alone; alone, or with no retries, the
    result stands. A count a process reports is an int in range, else nothing."""
    from kernelagent.harness.server import job as job_mod, verdict

    def concluded(retries, shared=True, alone=False, status=Status.CORRECT):
        job = job_mod.Job.__new__(job_mod.Job)
        job.concurrency, job.alone, job.out_of_memory, job.shared_device = {}, alone, False, shared
        job.stage_timed_out, job.alloc_retries = False, retries
        _decided(job, status, "")
        job.conclude_concurrency()
        return job.facts.to_wire()

    result = concluded({"candidate": 3, "reference": 0})
    assert result["status"] == Status.HARNESS_ERROR and result["concurrency"]["retry_alone"]
    assert result["concurrency"]["alloc_retries"] == {"candidate": 3} and "re-run alone" in result["reason"]
    assert concluded({"reference": 1})["concurrency"]["retry_alone"]  # a baseline timed on a full device
    assert concluded({"candidate": 3}, alone=True)["status"] == Status.CORRECT
    assert concluded({"candidate": 3}, shared=False)["status"] == Status.CORRECT
    assert concluded({"candidate": 0})["status"] == Status.CORRECT
    assert concluded({"candidate": 3}, status=Status.INCORRECT)["status"] == Status.INCORRECT
    for bad in (True, -1, 2.5, "3", 10**12, None):
        assert verdict.count_claim(bad) == 0
    assert verdict.count_claim(7) == 7


def test_a_stage_past_its_limit_beside_others_is_retried_alone():
    """8 cold jobs at once on a 16-core H100 host ran 7 honest candidates past their 'start' or
    'compile' limits (their neighbours' compiles had the CPUs): a stage limit is the
    candidate's only once it is reached alone. A timed loop that held the device too long is the
    candidate's at once (its queued work), as before."""
    from kernelagent.harness.server import job as job_mod

    def concluded(stage_timed_out=True, shared=True, alone=False, status=Status.TIMEOUT):
        job = job_mod.Job.__new__(job_mod.Job)
        job.concurrency, job.alone, job.out_of_memory, job.shared_device = {}, alone, False, shared
        job.stage_timed_out, job.alloc_retries = stage_timed_out, {}
        _decided(job, status, "stage 'compile' ran past its 120 s limit")
        job.conclude_concurrency()
        return job.facts.to_wire()

    result = concluded()
    assert result["status"] == Status.HARNESS_ERROR and result["concurrency"]["retry_alone"]
    assert "re-run alone" in result["reason"] and "'compile' ran past" in result["reason"]
    assert concluded(alone=True)["status"] == Status.TIMEOUT
    assert concluded(shared=False)["status"] == Status.TIMEOUT
    assert concluded(stage_timed_out=False)["status"] == Status.TIMEOUT  # the slot limit: the candidate's


def test_inductor_compile_workers_are_the_servers_cpus_shared_among_its_jobs(monkeypatch):
    """Inductor's default is min(32, CPUs) workers in every reference process that compiles; the
    server shares its CPUs among the jobs it runs at once, and the caller's
    TORCHINDUCTOR_COMPILE_THREADS wins. The reference process sets Inductor's config itself (a
    server forked from the zygote may have imported it under another environment)."""
    import os

    import torch._inductor.config as inductor_config

    from kernelagent.harness.child import reference_side
    from kernelagent.harness.server import main as server_main

    monkeypatch.setenv(server_main.COMPILE_WORKERS_ENV, "unset")  # restored (removed) at teardown
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert server_main.share_compile_workers(4) == 4 and os.environ[server_main.COMPILE_WORKERS_ENV] == "4"
    assert server_main.share_compile_workers(1) == 16
    # a pool of 2 or 3 would start its processes on a cold evaluation's path: compiled in-process
    assert server_main.share_compile_workers(8) == 1 and os.environ[server_main.COMPILE_WORKERS_ENV] == "1"
    assert server_main.share_compile_workers(5) == 1
    assert server_main.share_compile_workers(32) == 1
    before = inductor_config.compile_threads
    try:
        monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
        monkeypatch.setenv(server_main.COMPILE_WORKERS_ENV, "2")
        inductor_config.compile_threads = 16  # as decided when Inductor's config was imported
        assert reference_side.set_compile_workers() == 2 and inductor_config.compile_threads == 2
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "5")  # the caller's choice wins
        assert reference_side.set_compile_workers() == 5 and inductor_config.compile_threads == 5
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "many")
        assert reference_side.set_compile_workers() is None and inductor_config.compile_threads == 5
    finally:
        inductor_config.compile_threads = before
    from kernelagent.harness import Evaluator

    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in Evaluator(device="cpu", cpus=[0, 1])._server_env()


def test_alloc_pressure_counts_only_inside_its_phases(monkeypatch):
    import torch

    from kernelagent.harness.child.common import AllocPressure

    stats = {"num_alloc_retries": 0}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dict(stats))
    pressure = AllocPressure(torch.device("cuda", 0))
    stats["num_alloc_retries"] = 5  # before any timed phase: not counted
    with pressure.counting():
        stats["num_alloc_retries"] = 7
    stats["num_alloc_retries"] = 20  # between phases: not counted
    with pressure.counting():
        pass
    assert pressure.retries == 2
    assert AllocPressure(torch.device("cpu")).retries == 0


def test_kernel_reward_batch_is_evaluated_concurrently(tmp_path):
    from kernelagent.harness.caller.pool import EvaluatorPool
    from kernelagent.rl.trl import KernelReward

    pool = EvaluatorPool(devices=["cpu"], cache_dir=tmp_path, jobs_per_device=3)
    spans: list[list[float]] = []

    class Recording:  # the pool, with each result's server span noted
        def submit(self, *job):
            future = pool.submit(*job)
            future.add_done_callback(lambda f: spans.append(f.result().concurrency["span"]))
            return future

    problem = CANDIDATES / "relu_problem.py"
    good = "```python\n" + read(CANDIDATES / "relu_good.py") + "\n```"
    wrong = "```python\n" + read(CANDIDATES / "relu_wrong.py") + "\n```"
    try:
        reward = KernelReward(backend=Recording(), eval_config=_config(), dedupe=False)
        scores = reward(completions=[good, wrong, "# other\n" + good], problem_path=[str(problem)] * 3)
    finally:
        pool.close()
    assert len(scores) == 3 and scores[0] == scores[2] and scores[1] < scores[0]  # in order
    assert len(spans) == 3
    assert any(_overlap(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]), spans


def test_a_job_forked_during_a_hold_is_stopped_at_once():
    gate = Gate()
    a, late = _FakeJob("a"), _FakeJob("late")
    gate.register(a)
    with gate.hold(a):
        gate.register(late)
        assert late.frozen == [True] and late.paused == 1
    assert late.frozen == [True, False] and late.paused == 0


def test_freezing_a_job_stops_descendants_in_groups_of_their_own():
    """A reference's Inductor compile workers and ninja's nvcc commands (ninja gives each command
    a process group of its own) are stopped with their job while a neighbour times, and go on
    afterwards: a frozen job leaves the host's cores to the timed loop."""
    import subprocess
    import sys

    from kernelagent.harness.server.gate import process_tree, signal_processes

    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)

    def state(pid: int) -> str:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]

    try:
        grandchild = int(parent.stdout.readline())
        assert process_tree(parent.pid) >= {parent.pid, grandchild}
        signal_processes([parent.pid], True)
        time.sleep(0.2)
        assert state(parent.pid) == "T" and state(grandchild) == "T"
        signal_processes([parent.pid], False)
        time.sleep(0.2)
        assert state(grandchild) in ("R", "S") and state(parent.pid) in ("R", "S")
    finally:
        for pid in process_tree(parent.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        parent.wait(10)


@pytest.mark.parametrize("start_known", [True, False])
def test_a_continue_lets_go_of_what_the_stop_recorded_without_walking_again(monkeypatch, start_known):
    """The timed loop stops and continues the candidate around each of its segments (256 a loop
    for a 256 MiB output on an H200, where each continue walked the process tree and scanned every
    process's pid namespace once more). A continue now lets go of what the stop recorded, by pid
    and start time, and of the process group, with no walk and no members() scan. Let go all the
    same: a child in a group of its own (a setsid helper), a namespace member outside the tree, and
    a group member that left the tree before the stop (its parent exited), which only the killpg
    reached. Where the stop could not read a start time, the continue walks as before."""
    import subprocess
    import sys

    from kernelagent.harness.server import gate

    sleeper = "import time; time.sleep(60)"
    middle = ("import subprocess, sys\n"
              f"g = subprocess.Popen([sys.executable, '-c', {sleeper!r}])\n"
              "print(g.pid, flush=True)\n")  # exits at once: its child is reparented out of the tree
    code = ("import subprocess, sys, time\n"
            f"child = subprocess.Popen([sys.executable, '-c', {sleeper!r}], start_new_session=True)\n"
            f"middle = subprocess.Popen([sys.executable, '-c', {middle!r}], stdout=subprocess.PIPE, text=True)\n"
            "orphan = int(middle.stdout.readline())\n"
            "middle.wait()\n"
            "print(child.pid, orphan, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    member = subprocess.Popen([sys.executable, "-c", sleeper])  # not in the tree: found by members() only
    child, orphan = (int(x) for x in parent.stdout.readline().split())

    class Proc:  # what Stops reads of a multiprocessing process
        pid = parent.pid

    walks, scans = [], []
    real_tree = gate.process_tree
    monkeypatch.setattr(gate, "process_tree", lambda pid: walks.append(pid) or real_tree(pid))
    if not start_known:
        monkeypatch.setattr(gate, "start_time", lambda pid: None)

    def members() -> list[int]:
        scans.append(1)
        return [member.pid]

    everyone = (parent.pid, child, orphan, member.pid)
    stops = gate.Stops()
    try:
        assert orphan not in real_tree(parent.pid) and os.getpgid(orphan) == parent.pid
        stops.signal(Proc(), True, members)
        time.sleep(0.2)  # a signal is delivered asynchronously
        assert {pid: gate.proc_stat(pid)[1] for pid in everyone} == {pid: "T" for pid in everyone}
        assert len(walks) == 2 and len(scans) == 1  # the stop walks twice and scans once
        assert orphan not in stops.pids and member.pid in stops.pids  # the killpg alone reached the orphan
        walks.clear(), scans.clear()
        stops.signal(Proc(), False, members)
        time.sleep(0.2)
        assert all(gate.proc_stat(pid)[1] in ("R", "S") for pid in everyone), \
            {pid: gate.proc_stat(pid)[1] for pid in everyone}
        assert (len(walks), len(scans)) == ((0, 0) if start_known else (1, 1))
        assert stops.pids == {}
    finally:
        for pid in (child, orphan, member.pid, parent.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        parent.wait(10)
        member.wait(10)


def test_a_stopped_process_that_left_the_tree_is_let_go():
    """A process the gate stopped whose parent then dies is reparented out of the job's tree; the
    continue lets go of exactly what the stop reached (pid and start time), so it is not left
    stopped for ever (a neighbour's stage then ran into its limit on an H100)."""
    import subprocess
    import sys

    from kernelagent.harness.server.gate import (continue_processes, proc_stat, process_tree, signal_processes,
                                                 start_time)

    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    def state(pid: int) -> str:
        return proc_stat(pid)[1]

    child = int(parent.stdout.readline())
    try:
        stopped = signal_processes([parent.pid], True)
        time.sleep(0.2)  # a signal is delivered asynchronously
        assert stopped.get(child) == start_time(child) and state(child) == "T"
        parent.kill()
        parent.wait(10)
        time.sleep(0.2)
        assert child not in process_tree(parent.pid)
        signal_processes([parent.pid], False)  # the tree no longer reaches the child
        time.sleep(0.1)
        assert state(child) == "T"
        continue_processes(stopped)
        time.sleep(0.1)
        assert state(child) in ("R", "S")
        # a pid whose start time no longer matches (reused) is never signalled
        os.kill(child, signal.SIGSTOP)
        continue_processes({child: start_time(child) + 1})
        time.sleep(0.1)
        assert state(child) == "T"
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_drain_is_credited_to_a_neighbour_that_has_not_run_candidate_code():
    """The wait for the device to go idle is not credited to neighbours (their own queued work
    is what it waits for), except to one still in its 'start' stage: no candidate code of its
    has run, so none of the device's work can be its own."""
    gate = Gate(idle_wait_s=5)
    a, starting, timing_ = _FakeJob("a"), _FakeJob("starting"), _FakeJob("timing")
    starting.stage, timing_.stage = "start", "correctness"
    for job in (a, starting, timing_):
        gate.register(job)
    seen = []

    def probe():
        seen.append((starting.paused, timing_.paused))
        return len(seen) > 2

    with gate.hold(a, probe):
        assert starting.paused == 1 and timing_.paused == 1  # the hold itself: both credited
    assert seen and all(s == (1, 0) for s in seen), seen
    assert starting.paused == 0 and timing_.paused == 0


def test_the_reference_dying_of_cuda_out_of_memory_beside_others_is_retried_alone():
    """H100 suite run: level2/9's reference process died at torch.cuda.set_device with 'CUDA error:
    out of memory' while other jobs held the device. Its exit (code 1) said nothing of memory; its log
    did. That is a harness error re-run alone, never a verdict; a plain exit stays a harness error."""
    from kernelagent.harness.server import job as job_mod

    log = ('  File ".../reference_side.py", line 45, in __init__\n    torch.cuda.set_device(device)\n'
           "torch.AcceleratorError: CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'\n")
    assert job_mod._says_out_of_memory(log)
    assert not job_mod._says_out_of_memory("ValueError: the problem raised\n")
    job = job_mod.Job.__new__(job_mod.Job)
    job.concurrency, job.alone, job.shared_device = {}, False, True
    job.stage_timed_out, job.alloc_retries = False, {}
    job.out_of_memory = job_mod._says_out_of_memory(log)
    _decided(job, Status.HARNESS_ERROR, "the reference process exited with code 1 during stage 'compile'")
    job.conclude_concurrency()
    assert job.facts.concurrency["retry_alone"] and "re-run alone" in job.facts.reason


@pytest.mark.parametrize("readings, flagged", [([(True, True)], None), ([(True, False)], "bandwidth-busy"),
                                               ([(False, True)], "device-busy")])
def test_a_timed_loop_says_when_the_device_never_read_quiet(monkeypatch, readings, flagged):
    """Bandwidth that stays loud past the wait is said in an info flag (it may be the device's own
    state, never the candidate's doing); a device never idle of other kernels stays `device-busy`."""
    from types import SimpleNamespace

    from kernelagent.harness.server import gate as gate_mod, timed

    monkeypatch.setattr(gate_mod, "BANDWIDTH_WAIT_S", 0.02)
    gate = Gate(idle_wait_s=0.1)
    flags = []
    job = SimpleNamespace(job_id="a", freeze=lambda stop: None, freeze_candidate=lambda stop: None,
                          pause_clock=lambda paused: None, gate=gate, fingerprint={"cuda": True}, concurrency={},
                          idle_probe=lambda: readings[0], flag=flags.append)
    gate.register(job)
    loop = timed.TimedLoop(job)
    loop._timed_loop = lambda deadline: True
    assert loop.timed_loop(time.monotonic() + 5) is True
    assert [f["kind"] for f in flags] == ([flagged] if flagged else [])
    if flagged == "bandwidth-busy":
        assert flags[0]["severity"] == "info"

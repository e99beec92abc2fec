"""The kernel trace's channel (kernelagent/harness/trace/channel.py, issue 55) and the markers'
numbering (child/timing.FixedLoop) on the CPU: the server's reader is bounded and says when it
overflowed, ends at the writer's end of file or a short drain, and the child's preparation sets
what the driver reads at cuInit only where a tracer was given."""

from __future__ import annotations

from types import SimpleNamespace

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kernelagent.harness.child import timing
from kernelagent.harness.server.job_record import JobRecord
from kernelagent.harness.trace import build, channel, marks


def _write_in_child(ch: channel.Channel, data: bytes, keep_open: bool = False) -> subprocess.Popen:
    """A process that writes `data` into the channel's write end (as the traced process does)."""
    code = ("import os,sys; fd=int(sys.argv[1]); data=sys.stdin.buffer.read(); "
            "[os.write(fd, data[i:i+4096]) for i in range(0, len(data), 4096)]; "
            + ("import time; time.sleep(30)" if keep_open else ""))
    proc = subprocess.Popen([sys.executable, "-c", code, str(ch.write_fd)], stdin=subprocess.PIPE,
                            pass_fds=(ch.write_fd,))
    proc.stdin.write(data)
    proc.stdin.close()
    return proc


@pytest.mark.parametrize("size,cap,overflow", [(0, 1 << 20, False), (300_000, 1 << 20, False),
                                               (300_000, 100_000, True)])
def test_the_reader_keeps_what_came_up_to_its_bound(size, cap, overflow):
    data = b"".join(b'{"seq":%d,"t":"x"}\n' % i for i in range(size // 16))[:size]
    ch = channel.open_channel(cap_bytes=cap)
    ch.start()
    proc = _write_in_child(ch, data)
    proc.wait(timeout=60)
    got = ch.collect()
    assert got.ended and got.overflow is overflow and got.read_bytes == len(data)
    assert got.data == data[:cap]
    assert ch.read_fd == -1 and ch.write_fd == -1


def test_a_writer_that_keeps_its_end_open_is_drained_not_waited_for():
    ch = channel.open_channel()
    ch.start()
    proc = _write_in_child(ch, b'{"seq":0,"t":"hello"}\n', keep_open=True)
    try:
        deadline = time.monotonic() + 30
        while not ch._read and time.monotonic() < deadline:
            time.sleep(0.05)
        got = ch.collect(drain_s=0.2)
        assert got.data == b'{"seq":0,"t":"hello"}\n' and not got.ended and not got.overflow
    finally:
        proc.kill()
        proc.wait()


def test_a_job_that_never_forked_gives_both_ends_back():
    ch = channel.open_channel()
    fds = (ch.read_fd, ch.write_fd)
    ch.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


@pytest.mark.parametrize("spec,expect_fd", [(None, None), ({}, None), ({"library": ""}, None),
                                            ({"library": "LIB", "fd": "pipe"}, "pipe"),
                                            ({"library": "LIB", "fd": None}, "devnull")])
def test_the_child_is_prepared_only_where_a_tracer_is_given(spec, expect_fd, monkeypatch, tmp_path):
    loaded = []
    monkeypatch.setattr(channel.ctypes, "CDLL", lambda path, mode=0: loaded.append(path))
    monkeypatch.setenv(channel.ENV_LIB, "/left/over")  # replaced where a tracer of ours is given
    monkeypatch.setenv(channel.ENV_FD, "99")
    r, w = os.pipe()
    try:
        if spec is not None:
            spec = {k: (str(tmp_path / "lib.so") if v == "LIB" else w if v == "pipe" else v) for k, v in spec.items()}
        keep = channel.prepare_child(spec)
        if expect_fd is None:
            assert keep == [] and loaded == []
            assert os.environ[channel.ENV_LIB] == "/left/over"  # not ours: left as it was
            return
        assert loaded == [str(tmp_path / "lib.so")] and os.environ[channel.ENV_LIB] == loaded[0]
        assert keep == [int(os.environ[channel.ENV_FD])]
        if expect_fd == "pipe":
            assert keep == [w]
        else:
            assert os.readlink(f"/proc/self/fd/{keep[0]}") == os.devnull
            os.close(keep[0])
    finally:
        os.close(r)
        os.close(w)


def test_for_server_says_why_there_is_no_tracer():
    assert build.for_server(cuda=False) == {"unavailable": "no CUDA device"}
    assert "turned off" in build.for_server(cuda=True, env={build.OFF_ENV: "0"})["unavailable"]


def test_the_servers_tracer_is_built_beside_its_imports_and_awaited_before_use(monkeypatch):
    """Issue 59: with empty caches the tracer's build (a C compiler run) went after the server's
    imports, on a cold `eval`'s path. It now starts in a thread before them; the server takes its
    answer (waiting for it) before any job's process is forked, and a wrong guess about CUDA is
    answered as before."""
    import threading
    import time

    ran = []

    def slow_for_server(*, cuda: bool, **_):
        ran.append((cuda, threading.current_thread().name))
        time.sleep(0.3)
        return {"library": "/x/libkernelagent_trace.so"} if cuda else {"unavailable": "no CUDA device"}

    monkeypatch.setattr(build, "for_server", slow_for_server)
    started = time.monotonic()
    beside = build.ServerBuild(cuda=True)
    assert time.monotonic() - started < 0.2  # the server goes on to its imports at once
    assert beside.result(cuda=True) == {"library": "/x/libkernelagent_trace.so"}
    assert ran == [(True, "kernelagent-trace-build")] and beside.seconds >= 0.3
    # the probe found no CUDA after all: no tracer, whatever the thread built
    assert beside.result(cuda=False) == {"unavailable": "no CUDA device"}
    # CUDA not expected: nothing started; found after all, it is built then, in the server's thread
    ran.clear()
    late = build.ServerBuild(cuda=False)
    assert ran == [] and late.result(cuda=True) == {"library": "/x/libkernelagent_trace.so"}
    assert ran == [(True, threading.current_thread().name)]


class _Marks:
    available = True

    def __init__(self):
        self.calls: list[tuple[int, int, bool]] = []

    def mark(self, *, stream: int, phase: int, index: int, end: bool) -> int:
        self.calls.append((phase, index, end))
        return 0


class _Timer:
    """Timer._one_out's contract with the markers: begin before the call, end after it."""
    cuda = False

    def _one_out(self, fn: Any, inputs: Any, first: bool = False, mark: Any = None):
        if mark is not None:
            mark(False)
        out = fn(*inputs)
        if mark is not None:
            mark(True)
        return 1.0, 1.0, out

    def samples(self, readings):
        return [e for e, _ in readings]

    def escaped_ms(self, readings):
        return 0.0


def test_the_loop_numbers_warm_ups_and_timed_calls_across_segments(monkeypatch):
    monkeypatch.setattr(timing, "_current_stream_handle", lambda: 0)
    got = _Marks()
    loop = timing.FixedLoop(_Timer(), marks=got)
    sets = [[1]] * 8
    loop.run(lambda x: x, sets, 0, 2, phase=marks.WARMUP)
    loop.run(lambda x: x, sets, 0, 3, phase=marks.TIMED, first_index=0)
    loop.run(lambda x: x, sets, 1, 2, phase=marks.TIMED, first_index=3)
    pairs = [(p, i) for p, i, end in got.calls if not end]
    assert [(p, i) for p, i, end in got.calls if end] == pairs
    assert pairs == [(4, 0), (4, 1), (3, 0), (3, 1), (3, 2), (4, 3), (3, 3), (3, 4)]


def test_no_marks_without_a_tracer():
    loop = timing.FixedLoop(_Timer(), marks=marks.Marks(reason="none"))
    assert loop._marker(3, 0) is None
    assert timing.FixedLoop(_Timer())._marker(3, 0) is None


class _Job:
    def __init__(self, tmp_path, library: str | None):
        self.scratch = tmp_path / "candidate"
        self.scratch.mkdir()
        self.fingerprint = {"trace": {"library": library} if library else {"unavailable": "no CUDA device"}}
        self.child_job = {"job_id": "j"}
        self.facts = JobRecord()
        self.config = SimpleNamespace(profile=False, trace=True, evidence="trace")
        self.request: dict[str, Any] = {}


def test_a_job_without_a_tracer_forks_its_processes_unchanged(tmp_path):
    from kernelagent.harness.server import trace_stage

    job = _Job(tmp_path, None)
    assert trace_stage.open_for(job) == (job.child_job, job.child_job)
    trace_stage.collect(job)
    trace_stage.close(job)
    assert job.trace_channel is None and job.trace is None and job.facts.trace is None


def test_an_asked_for_profile_is_not_traced(tmp_path):
    """torch.profiler needs CUPTI to itself (an H200 profile read no kernels beside the tracer)."""
    from kernelagent.harness.server import trace_stage

    library = tmp_path / "libkernelagent_trace.so"
    library.write_bytes(b"\x7fELF tracer")
    job = _Job(tmp_path, str(library))
    job.config.profile = True
    assert trace_stage.open_for(job) == (job.child_job, job.child_job) and job.trace_channel is None


def test_a_job_asked_untraced_runs_without_the_tracer_and_is_judged_by_nsight_compute(tmp_path):
    """EvalConfig.trace=False (benchmarks/trace_cost.py): no tracer in either process, so the
    evidence falls back to Nsight Compute (never none), and nothing is shared with traced jobs:
    the loop's calibration keys on the whole config, the baselines' cache on `traced`."""
    from kernelagent.harness.caller.baseline_cache import BaselineCache
    from kernelagent.harness.config import EvalConfig
    from kernelagent.harness.server import evidence, trace_stage

    library = tmp_path / "libkernelagent_trace.so"
    library.write_bytes(b"\x7fELF tracer")
    job = _Job(tmp_path, str(library))
    job.config.trace = False
    assert trace_stage.open_for(job) == (job.child_job, job.child_job) and job.trace_channel is None
    assert not evidence.traced(job) and evidence.ncu_planned(job)
    job.config.trace = True
    trace_stage.open_for(job)
    assert evidence.traced(job) and not evidence.ncu_planned(job)
    trace_stage.close(job)
    cache = BaselineCache(tmp_path / "cache")
    fingerprint = {"gpu_name": "H200", "trace": {"library": str(library)}}
    assert cache.key("p", fingerprint, EvalConfig()) != cache.key("p", fingerprint, EvalConfig(trace=False))
    assert cache.key("p", {"gpu_name": "H200"}, EvalConfig()) == cache.key("p", {"gpu_name": "H200"},
                                                                          EvalConfig(trace=False))
    with pytest.raises(ValueError, match="trace must be true or false"):
        EvalConfig(trace="no")


def test_a_job_with_a_tracer_gives_the_candidate_its_own_copy_and_channel(tmp_path, monkeypatch):
    from kernelagent.harness.server import trace_stage

    library = tmp_path / "cache" / "libkernelagent_trace.so"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF tracer")
    job = _Job(tmp_path, str(library))
    ref_job, cand_job = trace_stage.open_for(job)
    # the reference's own channel (issue 58: its baselines' device times), never the candidate's
    assert ref_job["trace"] == {"library": str(library), "fd": job.ref_trace_channel.write_fd}
    assert ref_job["job_id"] == "j" and ref_job["trace"]["fd"] != job.trace_channel.write_fd
    own = Path(cand_job["trace"]["library"])
    assert own.parent.parent == job.scratch and own.read_bytes() == library.read_bytes()
    assert own.stat().st_mode & 0o777 == 0o555
    assert cand_job["trace"]["fd"] == job.trace_channel.write_fd
    os.write(cand_job["trace"]["fd"], b'{"seq":0,"t":"hello"}\n')
    monkeypatch.setenv(trace_stage.DUMP_ENV, str(tmp_path / "dump"))
    job.job_id = "job/../x1"
    trace_stage.collect(job)
    assert job.trace.data == b'{"seq":0,"t":"hello"}\n' and job.trace.ended
    assert (tmp_path / "dump" / "jobx1.jsonl").read_bytes() == job.trace.data
    assert job.facts.trace == {"bytes": 22, "overflow": False, "ended": True}
    assert job.ref_trace_channel is not None  # the reference may still time its baselines
    trace_stage.close_reference(job)
    assert job.ref_trace_channel is None


def test_a_traced_process_forgets_the_variables_once_cuda_has_started(monkeypatch):
    monkeypatch.setenv(channel.ENV_LIB, "/scratch/.ka-trace/libkernelagent_trace.so")
    monkeypatch.setenv(channel.ENV_FD, "7")
    channel.forget_env()
    probe = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('CUDA_INJECTION64_PATH'), "
                            "os.environ.get('KERNELAGENT_TRACE_FD'))"], capture_output=True, text=True)
    assert probe.stdout.split() == ["None", "None"]


def test_the_rules_are_told_what_the_server_ordered_not_what_the_candidate_said(tmp_path):
    from kernelagent.harness.server import trace_stage

    job = _Job(tmp_path, None)
    trace_stage.open_for(job)
    job.trace_checks = 3
    job.request = {"candidate_source": "import triton\n@triton.jit\ndef relu_kernel(x):\n    pass\n"}
    job.facts = JobRecord(timed_loop={"calls": 40, "segments": 2, "warmup_calls": 5},
                          timings={"candidate": {"median_ms": 0.012}})
    from kernelagent.harness.trace.calls import Expected

    assert trace_stage.expected(job) == Expected(own_names=frozenset({"relu_kernel"}), checks=3, timed=40,
                                                 warmups=5, median_ms=0.012,
                                                 phases=frozenset({"first", "check", "warmup", "timed"}))
    job.facts = JobRecord(timed_loop={"calls": 0, "warmup_calls": 0}, timings={"candidate": {"median_ms": True}})
    told = trace_stage.expected(job)  # no loop ran: no marker of its phases is the server's
    assert told.phases == frozenset({"first", "check"}) and told.median_ms is None

"""A warm harness that outlives one command (issue 39; caller/daemon.py, server/listen.py): reused
by a second command, refused to another user, replaced when stale, alive after a candidate
crashes, stopped when idle, and giving the same results as a private server."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from kernelagent.harness import EvalConfig, Evaluator, StageTimeouts, Status
from kernelagent.harness.caller import daemon
from tests.conftest import CANDIDATES, read

CONFIG = EvalConfig(trials=1, baselines=False, seed=7)
RELU = CANDIDATES / "relu_problem.py"


@pytest.fixture()
def runtime(tmp_path, monkeypatch):
    where = tmp_path / "run"
    monkeypatch.setenv("KERNELAGENT_RUNTIME_DIR", str(where))
    monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    yield where
    _stop_all(where)


def _stop_all(where: Path) -> None:
    """No harness of a test outlives it."""
    for sock in where.glob("*.sock") if where.exists() else []:
        s = daemon.connect(sock)
        if s is None:
            continue
        import struct

        pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        s.close()
        try:
            os.killpg(pid, 9)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _gone(info: dict) -> str:
    """What became of the harness of `info` (for a failed assertion): alive, or its exit status
    (this test process started it, so it is ours to reap), and its log's last lines."""
    pid, status = info.get("pid"), "alive"
    if isinstance(pid, int) and not _alive(pid):
        try:
            _, code = os.waitpid(pid, os.WNOHANG)
            status = f"ended: {'signal ' + str(os.WTERMSIG(code)) if os.WIFSIGNALED(code) else 'exit ' + str(os.WEXITSTATUS(code))}"
        except ChildProcessError:
            status = "ended (reaped already)"
    log = Path(info["log"]) if info.get("log") else None
    tail = log.read_text(errors="replace")[-1500:] if log is not None and log.exists() else "(no log)"
    return f"harness {pid}: {status}; log:\n{tail}"


def _evaluate(cache: Path, candidate: str, **kwargs) -> tuple:
    with Evaluator(device="cpu", cache_dir=cache, daemon=True, **kwargs) as ev:
        result = ev.evaluate(RELU, candidate, CONFIG)
        return result, dict(ev.daemon_info), dict(ev.isolation)


def test_a_second_command_reuses_the_warm_harness_and_a_crash_does_not_end_it(runtime, tmp_path):
    first, info1, iso = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    assert first.status == Status.CORRECT, first.reason
    assert info1["started_now"] and _alive(info1["pid"]) and iso["daemon"]["pid"] == info1["pid"]
    assert info1["why_started"] == "no harness of these settings was listening (no socket)"
    assert oct(os.stat(runtime).st_mode & 0o777) == "0o700"
    assert oct(os.stat(info1["socket"]).st_mode & 0o777) == "0o600"
    crashed, info2, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "segfaults.py"))
    assert crashed.status == Status.CRASHED, crashed.reason
    assert not info2["started_now"] and info2["pid"] == info1["pid"], (info2, _gone(info1))
    assert "why_started" not in info2 and info2["log"] == info1["log"]
    again, info3, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    assert again.status == Status.CORRECT and info3["pid"] == info1["pid"], (again.reason, info3, _gone(info1))
    assert again.stage_seconds.get("server_start", 0.0) < 2.0  # no server start: it was warm
    # other settings (another cache root): another harness
    other, info4, _ = _evaluate(tmp_path / "cache2", read(CANDIDATES / "relu_good.py"))
    assert other.status == Status.CORRECT and info4["pid"] != info1["pid"], (other.reason, info4)


def test_eval_uses_the_warm_harness_by_default_and_no_daemon_a_private_server(runtime, tmp_path, monkeypatch):
    """Issue 59: with KERNELAGENT_DAEMON unset `kernelagent eval` reaches this user's warm harness
    (its result says which, `isolation.daemon`); `--no-daemon` and KERNELAGENT_DAEMON=0 keep a
    server of the command's own, as before."""
    import json

    from typer.testing import CliRunner

    from kernelagent.cli import app

    args = ["eval", str(RELU), str(CANDIDATES / "relu_good.py"), "--json", "--device", "cpu", "--trials", "1",
            "--no-timing", "--no-baselines", "--cache-dir", str(tmp_path / "cache")]

    def run(*extra: str) -> dict:
        invoked = CliRunner().invoke(app, [*args, *extra])
        assert invoked.exit_code == 0, invoked.output
        result = json.loads(invoked.stdout.strip().splitlines()[-1])
        assert result["status"] == "correct", result.get("reason")
        return result["isolation"]

    warm = run()
    info = warm.get("daemon")
    assert isinstance(info, dict) and info["started_now"] and _alive(info["pid"]), warm
    assert Path(info["socket"]).parent == runtime
    assert "daemon" not in run("--no-daemon")
    monkeypatch.setenv("KERNELAGENT_DAEMON", "0")
    assert "daemon" not in run()
    again = run("--daemon")["daemon"]  # the flag wins over the variable, and finds it warm
    assert not again["started_now"] and again["pid"] == info["pid"], (again, _gone(info))


def test_bench_uses_a_warm_harness_per_device_by_default_and_its_record_says_so(runtime, tmp_path):
    """Issue 59: `kernelagent bench` with KERNELAGENT_DAEMON unset sends each device's evaluations
    to this user's warm harness: the run's record (summary.json's run.fingerprint.harness, the
    report's header) and every result (isolation.daemon) say which; the next batch of the same
    settings finds it warm; `--no-daemon` runs a server of the run's own and says so."""
    import json

    from typer.testing import CliRunner

    from kernelagent.bench.store import Store
    from kernelagent.cli import app

    repo = Path(__file__).parent / "ci_repo"

    def run(name: str, *extra: str) -> tuple[dict, list[dict]]:
        store = tmp_path / f"{name}.sqlite"  # a store each: nothing answered from another run's
        invoked = CliRunner().invoke(app, ["bench", str(repo / "problems"), "--candidates", str(repo / "kernels"),
                                           "--filter", "relu", "--gpus", "cpu", "--trials", "1", "--no-timing",
                                           "--no-baselines", "--no-live", "--store", str(store), "--cache-dir",
                                           str(tmp_path / "cache"), "--run", name, "--out", str(tmp_path / name),
                                           *extra], env={"COLUMNS": "200"})
        assert invoked.exit_code == 0, invoked.output
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["metrics"]["correct"] == 1, summary["problems"]
        with Store(store) as db:
            rows = db._query("SELECT e.result FROM evaluation_log l JOIN evaluations e ON e.key = l.key "
                             "WHERE l.run_id = ?", (name,))
        results = [json.loads(r["result"]) for r in rows]
        assert results, invoked.output
        harness = summary["run"]["fingerprint"]["harness"]
        return {"harness": harness, "output": invoked.output,
                "report": (tmp_path / name / "report.html").read_text()}, [r["isolation"] for r in results]

    first, isolations = run("warm1")
    info = isolations[0].get("daemon")
    assert isinstance(info, dict) and info["started_now"] and _alive(info["pid"]), isolations
    assert Path(info["socket"]).parent == runtime
    assert first["harness"] == {"kind": "warm", "devices": [{"device": "cpu", "warm": True, "started_now": True,
                                                             "socket": info["socket"]}]}, first["harness"]
    assert "this user's warm harness per device (1 of 1 started by this session)" in first["output"]
    assert "harness: this user&#x27;s warm harness per device" in first["report"]
    second, isolations = run("warm2")  # the next batch: found warm
    again = isolations[0]["daemon"]
    assert not again["started_now"] and again["pid"] == info["pid"], (again, _gone(info))
    assert second["harness"]["kind"] == "warm" and "(found warm)" in second["output"]
    own, isolations = run("own", "--no-daemon")
    assert all("daemon" not in i for i in isolations), isolations
    assert own["harness"] == {"kind": "own", "devices": [{"device": "cpu", "warm": False}]}, own["harness"]
    assert "servers of the run's own" in own["output"] and "harness: servers of the run&#x27;s own" in own["report"]


def test_a_runtime_folder_past_the_socket_path_limit_is_used_as_it_is(tmp_path, monkeypatch):
    """sun_path holds 107 bytes: a longer KERNELAGENT_RUNTIME_DIR (a test's tmp_path under
    pytest-xdist, a deep home) still starts the harness, and the next command finds it."""
    where = tmp_path / ("long-" + "x" * 110)
    monkeypatch.setenv("KERNELAGENT_RUNTIME_DIR", str(where))
    monkeypatch.delenv("KERNELAGENT_DAEMON", raising=False)
    try:
        first, info1, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
        assert first.status == Status.CORRECT, first.reason
        assert len(os.fsencode(info1["socket"])) > 108 and info1["started_now"]
        again, info2, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
        assert again.status == Status.CORRECT, again.reason
        assert not info2["started_now"] and info2["pid"] == info1["pid"], (info2, _gone(info1))
    finally:
        _stop_all(where)


def test_the_same_results_as_a_private_server(runtime, tmp_path):
    warm, info, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_wrong.py"))
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache-private", daemon=False) as ev:
        private = ev.evaluate(RELU, read(CANDIDATES / "relu_wrong.py"), CONFIG)
        assert "daemon" not in ev.isolation
    assert warm.status == private.status == Status.INCORRECT, (warm.reason, private.reason, _gone(info))
    assert [t.passed for t in warm.trials] == [t.passed for t in private.trials]
    assert warm.seeds["base"] == private.seeds["base"] == 7
    assert [t.max_abs_err for t in warm.trials] == [t.max_abs_err for t in private.trials]
    same = ("mode", "run_as", "job_uid", "guarantees")
    assert {k: warm.isolation["jail"].get(k) for k in same} == {k: private.isolation["jail"].get(k) for k in same}
    assert warm.isolation["mode"] == private.isolation["mode"]


def test_a_harness_that_died_or_runs_old_code_is_replaced(runtime, tmp_path, monkeypatch):
    _, info1, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    os.killpg(info1["pid"], 9)
    deadline = time.monotonic() + 10
    while _alive(info1["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(info1["socket"]).exists()  # left behind by the killed harness
    result, info2, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    assert result.status == Status.CORRECT, result.reason
    assert info2["started_now"] and info2["pid"] != info1["pid"]
    assert info2["socket"] == info1["socket"]
    # its socket refused us, or (the kill still under way) took us and closed without a word
    assert info2["why_started"].startswith(("no harness answered at the socket (Connection refused",
                                            "the socket's harness closed the connection without a hello")), info2
    # changed code: another socket, a new harness; the old one is never asked again
    monkeypatch.setitem(daemon._DIGEST, "d", "changed-code")
    result, info3, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    assert result.status == Status.CORRECT and info3["started_now"] and info3["socket"] != info2["socket"], \
        (result.reason, info3)


def test_an_idle_harness_stops_and_takes_its_socket_and_scratch_with_it(runtime, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAGENT_DAEMON_IDLE_S", "2")
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache", daemon=True) as ev:
        result = ev.evaluate(RELU, read(CANDIDATES / "relu_good.py"), CONFIG)
        assert result.status == Status.CORRECT, result.reason
        info, scratch = dict(ev.daemon_info), ev._scratch_root
        assert scratch is not None and scratch.exists()
    assert info["idle_timeout_s"] == 2.0
    deadline = time.monotonic() + 30
    while _alive(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(info["pid"])
    assert not Path(info["socket"]).exists() and not scratch.exists()
    # its log outlives it, and ends with why it stopped
    lines = Path(info["log"]).read_text().strip().splitlines()
    assert lines[0].endswith("harness started: no harness of these settings was listening (no socket)"), lines
    assert lines[-1].endswith("exiting: idle for 2 s"), lines


def test_another_user_is_refused(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    import shutil
    import tempfile

    runtime = Path(tempfile.mkdtemp(prefix="ka-run-", dir="/tmp"))  # under /tmp: others may reach it once opened
    monkeypatch.setenv("KERNELAGENT_RUNTIME_DIR", str(runtime))
    try:
        _refused(runtime, tmp_path)
    finally:
        _stop_all(runtime)
        shutil.rmtree(runtime, ignore_errors=True)


def _refused(runtime: Path, tmp_path: Path) -> None:
    _, info, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    sock_path = Path(info["socket"])

    def as_nobody(open_up: bool) -> str:
        if open_up:  # past the directory's and the socket's modes: the harness's own check remains
            os.chmod(runtime, 0o755)
            os.chmod(sock_path, 0o666)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(str(sock_path))
                except OSError as exc:
                    os.write(w, f"connect refused: {exc.errno}".encode())
                    os._exit(0)
                s.settimeout(10)
                data = s.recv(4096)
                os.write(w, b"hello" if data else b"closed")
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        out = os.read(r, 200).decode()
        os.close(r)
        return out

    assert as_nobody(False).startswith("connect refused")  # the directory is 0700
    assert as_nobody(True) == "closed"  # SO_PEERCRED: closed before a word is said
    os.chmod(runtime, 0o700)
    result, again, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    assert result.status == Status.CORRECT and again["pid"] == info["pid"], (result.reason, again)  # serves on


def test_an_unsafe_runtime_directory_is_not_used(tmp_path, monkeypatch):
    where = tmp_path / "shared"
    where.mkdir(mode=0o777)
    os.chmod(where, 0o777)
    monkeypatch.setenv("KERNELAGENT_RUNTIME_DIR", str(where))
    with pytest.raises(daemon.DaemonUnavailable, match="other users"):
        daemon.runtime_dir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    monkeypatch.setenv("KERNELAGENT_RUNTIME_DIR", str(link))
    with pytest.raises(daemon.DaemonUnavailable, match="not a directory"):
        daemon.runtime_dir()
    # the command runs its own server then, and says why
    monkeypatch.setenv("KERNELAGENT_RUNTIME_DIR", str(where))
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache", daemon=True) as ev:
        result = ev.evaluate(RELU, read(CANDIDATES / "relu_good.py"), CONFIG)
        assert result.status == Status.CORRECT, result.reason
        assert str(result.isolation["daemon"]).startswith("not used:") and ev._daemon is None


def test_an_interrupted_command_ends_only_its_own_job(runtime, tmp_path):
    import threading

    cache = tmp_path / "cache"
    slow = Evaluator(device="cpu", cache_dir=cache, daemon=True)
    hung: dict = {}
    config = EvalConfig(trials=1, baselines=False, seed=7)
    thread = threading.Thread(target=lambda: hung.update(r=slow.evaluate(RELU, read(CANDIDATES / "hangs.py"), config)))
    thread.start()
    deadline = time.monotonic() + 120  # until its job is in the harness (a loaded machine starts slowly)
    while not (slow._daemon is not None and slow._pending) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slow._pending, "the hanging evaluation never reached the warm harness"
    time.sleep(2.0)  # the hanging candidate is in its checks
    with Evaluator(device="cpu", cache_dir=cache, daemon=True) as other:
        other.fingerprint()  # connected
        pid = other.daemon_info["pid"]
        slow.abort()  # Ctrl-C in the first command: its connection goes
        thread.join(30)
        assert not thread.is_alive() and hung["r"].status == Status.HARNESS_ERROR
        result = other.evaluate(RELU, read(CANDIDATES / "relu_good.py"), config)
    slow.close()
    assert result.status == Status.CORRECT, result.reason
    assert _alive(pid)


class _Flaky:
    """A listening socket whose accept() fails as a loaded host's may, then times out."""

    def __init__(self, errors: list):
        self.errors = errors

    def accept(self):
        raise self.errors.pop(0) if self.errors else socket.timeout()

    def fileno(self) -> int:
        return 3


def test_a_failed_accept_or_greeting_costs_one_client_not_the_harness(tmp_path):
    import errno

    from kernelagent.harness.server.listen import Listener

    listener = Listener(tmp_path / "h.sock", idle_timeout=1.0)
    try:
        greeted: list = []

        def connection(conn):
            greeted.append(conn)
            if len(greeted) == 1:
                raise RuntimeError("a bug in one greeting")
            raise AssertionError("unreachable")

        real = listener.sock
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(tmp_path / "h.sock"))
        first, _ = real.accept()
        listener.sock = _Flaky([OSError(errno.EMFILE, "Too many open files")])
        # no descriptors left once, then idle: it serves on, and stops only when idle
        assert listener.serve(connection, busy=lambda: False) == "idle for 1 s"
        listener.sock = _Flaky([OSError(errno.EBADF, "Bad file descriptor")])
        assert listener.serve(connection, busy=lambda: False).startswith("its socket failed")
        # a greeting that raises: that client's connection closes, the harness goes on
        class _Once(_Flaky):
            def accept(self):
                if first is not None and not greeted:
                    return first, None
                return super().accept()
        listener.sock = _Once([])
        assert listener.serve(connection, busy=lambda: False) == "idle for 1 s"
        assert len(greeted) == 1
        client.settimeout(5)
        assert client.recv(10) == b""  # closed on it
        client.close()
        real.close()
    finally:
        listener.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.close()


def test_a_reaped_job_process_is_never_signalled_by_its_pid(monkeypatch):
    """Pids wrap (32768 on many hosts): once a job's process is reaped, its pid may be a warm
    harness's or anyone's, so only its group (reserved while a member lives) is signalled."""
    import multiprocessing as mp
    import signal

    from kernelagent.harness.server import processes

    ctx = mp.get_context("fork")
    proc = ctx.Process(target=os._exit, args=(0,))
    proc.start()
    proc.join(10)
    sent: list = []
    monkeypatch.setattr(processes.os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))
    monkeypatch.setattr(processes.os, "killpg", lambda pid, sig: sent.append(("killpg", pid, sig)))
    processes.kill_group(proc)
    assert sent == [("killpg", proc.pid, signal.SIGKILL)]
    live = ctx.Process(target=time.sleep, args=(30,))
    live.start()
    try:
        sent.clear()
        processes.kill_group(live)
        assert sent == [("killpg", live.pid, signal.SIGKILL), ("kill", live.pid, signal.SIGKILL)]
    finally:
        monkeypatch.undo()
        live.kill()
        live.join(10)


def test_a_passing_refusal_is_tried_again_before_the_harness_is_replaced(runtime, tmp_path, monkeypatch):
    first, info1, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    assert first.status == Status.CORRECT and info1["started_now"], (first.reason, info1)
    real, calls = daemon.connect, []

    def refuses_once(path, why=None):
        calls.append(path)
        if len(calls) == 1:
            if why is not None:
                why.append("no harness answered at the socket (Resource temporarily unavailable)")
            return None
        return real(path, why)

    monkeypatch.setattr(daemon, "connect", refuses_once)
    again, info2, _ = _evaluate(tmp_path / "cache", read(CANDIDATES / "relu_good.py"))
    assert again.status == Status.CORRECT, again.reason
    assert not info2["started_now"] and info2["pid"] == info1["pid"], (info2, _gone(info1))
    assert info2["reconnected_after"].startswith("no harness answered") and len(calls) == 2


def test_a_private_server_that_dies_mid_job_says_how_its_log_ends(tmp_path):
    """Under load beside the hostile tests a private server died mid-job and the result said only
    "the harness server died": the reason now carries its log's last line."""
    import threading

    config = EvalConfig(trials=1, target_ms=10, warmup_ms=2, max_reps=10, derived_checks=0,
                        timeouts=StageTimeouts(start=60, load=60, compile=60, correctness=60, timing=60))
    with Evaluator(device="cpu", cache_dir=tmp_path / "cache", daemon=False) as ev:
        ev.fingerprint()
        proc, log = ev._proc, ev._scratch_root / "server.log"
        box = {}
        worker = threading.Thread(target=lambda: box.update(r=ev.evaluate(RELU, read(CANDIDATES / "hangs.py"), config)))
        worker.start()
        time.sleep(3)  # the job is under way
        with open(log, "a") as fh:
            fh.write("kernelagent harness 4242: the last words\x1b[31m\n")
        os.killpg(proc.pid, 9)
        worker.join(120)
    result = box["r"]
    assert result.status == Status.HARNESS_ERROR, result.reason
    # its last line, with the terminal sequence taken out
    assert "server died" in result.reason and \
        result.reason.endswith("(its log ends: kernelagent harness 4242: the last words)"), result.reason

"""ncu runs the candidate's code itself, outside the server's per-job jail: it must run inside
bubblewrap or the per-job kernel namespaces (jail/exec_in.py), and unjailed only when the
user asked for it (issues 11, 24); one session per host, and under the server the candidate's
part waits for the device's timing slot (server/ncu.py). A fake `ncu` stands in for Nsight
Compute: it reports where it ran."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

import pytest

from kernelagent.harness.server import ncu as ncu_mod
from tests.conftest import CANDIDATES, read

FAKE_NCU = """#!/bin/sh
# Where am I? The pid namespace, whether the caller's environment is readable, and whether the
# home directory can be listed; then no DONE marker, so run_ncu reports this output.
echo "PIDNS=$(readlink /proc/self/ns/pid)"
if cat /proc/{caller}/environ >/dev/null 2>&1; then echo "CALLER_ENV=readable"; else echo "CALLER_ENV=hidden"; fi
exit 3
"""


def _fake_ncu(tmp_path: Path) -> Path:
    path = tmp_path / "ncu"
    path.write_text(FAKE_NCU.replace("{caller}", str(os.getpid())))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_without_bubblewrap_or_namespaces_ncu_does_not_run_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAGENT_NCU", str(_fake_ncu(tmp_path)))
    monkeypatch.setenv("KERNELAGENT_NCU_NO_NAMESPACES", "1")
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else "/bin/" + name)
    got = ncu_mod.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=30)
    assert got == {"unavailable": ncu_mod.UNSANDBOXED_NCU}
    asked = ncu_mod.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=30,
                              allow_unsandboxed=True)
    assert "PIDNS=" in asked["unavailable"]  # it ran, as asked


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed here")
def test_ncu_runs_inside_bubblewrap(tmp_path, monkeypatch):
    from kernelagent.harness.jail import sandbox

    if sandbox.bubblewrap_command(tmp_path) is None:
        pytest.skip("bubblewrap cannot create namespaces here")
    monkeypatch.setenv("KERNELAGENT_NCU", str(_fake_ncu(tmp_path)))
    got = ncu_mod.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=30)
    text = got["unavailable"]
    assert "PIDNS=" in text, text
    ours = os.readlink("/proc/self/ns/pid")
    assert f"PIDNS={ours}" not in text  # its own pid namespace
    assert "CALLER_ENV=hidden" in text  # the caller's /proc entry is out of its sight


JAILED_NCU = """#!/bin/sh
# Everything on one line: run_ncu reports the last lines of a failed run.
r="PIDNS=$(readlink /proc/self/ns/pid)"
if cat /proc/{caller}/environ >/dev/null 2>&1; then r="$r CALLER_ENV=readable"; else r="$r CALLER_ENV=hidden"; fi
r="$r TMP=[$(ls -A /tmp | tr '\\n' ' ')] HIDDEN=[$(ls -A {hidden} 2>&1 | tr '\\n' ' ')] TOP=[$(ls -A {top} 2>&1 | tr '\\n' ' ')]"
if touch /tmp/ncu-lock 2>/dev/null; then r="$r TMP_WRITABLE=yes"; else r="$r TMP_WRITABLE=no"; fi
if touch {outside}/x 2>/dev/null; then r="$r OUTSIDE_WRITABLE=yes"; else r="$r OUTSIDE_WRITABLE=no"; fi
r="$r TRITON=[$(ls -A .triton 2>&1)] LO=$(cat /sys/class/net/lo/operstate 2>/dev/null) $(grep CapEff /proc/self/status)"
echo "$r"
exit 3
"""


def test_without_bubblewrap_ncu_runs_in_the_per_job_jail(tmp_path, monkeypatch):
    """Kernel evidence is on by default and must hold with no bubblewrap installed: ncu then
    runs inside the per-job kernel namespaces (jail/exec_in.py), with a private /tmp."""
    if not ncu_mod.namespaces_work():
        pytest.skip("kernel namespaces do not work on this machine")
    hidden = tmp_path / "caches"
    hidden.mkdir()
    (hidden / "secret-entry").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "bin").mkdir()
    ncu = tmp_path / "bin" / "ncu"  # under /tmp, which the jail replaces: bound back read-only
    # A top-level directory made after the caller started: hidden as every job's jail hides it.
    top = Path(f"/ka-ncu-top-{os.getpid()}-{uuid.uuid4().hex[:8]}") if os.geteuid() == 0 else tmp_path / "no-top"
    top.mkdir()
    (top / "top-secret").write_text("x")
    ncu.write_text(JAILED_NCU.replace("{caller}", str(os.getpid())).replace("{hidden}", str(hidden))
                   .replace("{outside}", str(outside)).replace("{top}", str(top)))
    ncu.chmod(0o755)
    monkeypatch.setenv("KERNELAGENT_NCU", str(ncu))
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    sentinel = Path(tempfile.gettempdir()) / f"kernelagent-sentinel-{os.getpid()}"
    sentinel.write_text("the caller's temp files")
    own_cache = tmp_path / "own-triton"
    (own_cache / "abc").mkdir(parents=True)  # the candidate's kernels, compiled in its evaluation
    spawned = []
    try:
        got = ncu_mod.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=60,
                                hide=[hidden], on_spawn=spawned.append, scratch_parent=tmp_path,
                                triton_cache=own_cache)
    finally:
        sentinel.unlink()
        shutil.rmtree(top, ignore_errors=True)
    text = got["unavailable"]
    assert "PIDNS=" in text, text
    assert f"PIDNS={os.readlink('/proc/self/ns/pid')}" not in text  # its own pid namespace
    assert "CALLER_ENV=hidden" in text
    assert "HIDDEN=[" in text and "secret-entry" not in text  # the caller's caches: out of sight
    assert "TOP=[" in text and "top-secret" not in text  # a top-level directory: out of sight too
    assert "OUTSIDE_WRITABLE=no" in text  # a read-only root
    assert "TMP_WRITABLE=yes" in text and sentinel.name not in text  # a private /tmp of its own
    assert "LO=" in text and "LO=down" not in text  # a loopback, for ncu and its target
    assert "TRITON=[abc]" in text  # its own Triton cache, copied: not compiled again under ncu
    assert "CapEff:\t0000000000000000" in text  # no capabilities
    assert len(spawned) == 2 and isinstance(spawned[0], int) and spawned[1] is None
    assert not any(p.name.startswith("kernelagent-ncu-") for p in tmp_path.iterdir())  # its scratch is gone



def test_an_ncu_session_past_its_limit_is_killed_whole(tmp_path, monkeypatch):
    """ncu, the jail and the candidate's processes share one session: a timeout ends them all,
    a child the candidate left behind included."""
    pidfile = tmp_path / "child.pid"
    ncu = tmp_path / "ncu"
    ncu.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    ncu.chmod(0o755)
    monkeypatch.setenv("KERNELAGENT_NCU", str(ncu))
    monkeypatch.setenv("KERNELAGENT_NCU_NO_NAMESPACES", "1")
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    spawned = []
    got = ncu_mod.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=6,
                            allow_unsandboxed=True, on_spawn=spawned.append)
    assert "limit" in got["unavailable"], got
    child = int(pidfile.read_text())
    for _ in range(100):
        try:
            state = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            break  # gone
        if state == "Z":
            break  # killed, waiting for its reaper
        import time

        time.sleep(0.05)
    else:
        raise AssertionError(f"the session's child {child} outlived the timeout")
    assert spawned[0] is not None and spawned[-1] is None


@pytest.fixture(autouse=True)
def own_ncu_lock(tmp_path, monkeypatch):
    """Each test here takes a lock file of its own: under pytest-xdist another worker's profile
    or kernel evidence holds the host's (two CI failures: a lock that was never had)."""
    from kernelagent.harness import private_dir
    from kernelagent.harness.server import ncu_session

    # this user's private folder in the temp directory, never the shared temp directory itself (issue 54)
    assert ncu_session.ncu_lock_path().parent == private_dir.default_user_dir()
    monkeypatch.setattr(ncu_session, "ncu_lock_path", lambda: tmp_path / "ncu.lock")


def test_one_ncu_session_at_a_time_on_a_host():
    """Jailed sessions no longer share ncu's own lock file in /tmp, and ncu does not support two
    sessions on one device at once, so run_ncu takes a host-wide lock, and gives up after its
    budget."""
    import threading

    held = threading.Event()
    release = threading.Event()

    def holder():
        with ncu_mod.ncu_lock(5) as got:
            assert got
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        with ncu_mod.ncu_lock(0.3) as got:
            assert got is False  # busy: not had within the wait
    finally:
        release.set()
        thread.join()
    with ncu_mod.ncu_lock(1) as got:
        assert got is True


def test_the_profiled_calls_wait_for_the_device_slot_and_hold_it_until_done(tmp_path):
    """Under the server, ncu's target says READY before the candidate's code and waits; the slot
    (a context manager) is taken before it is let go and left only once the whole session has
    ended, whatever the candidate prints (a forged DONE does not let it out early)."""
    import contextlib
    import os as _os
    import time

    events = []

    @contextlib.contextmanager
    def slot():
        events.append(("enter", (tmp_path / "kernelagent-go").exists()))
        yield
        events.append(("exit", time.monotonic()))

    script = ('[ -n "$KERNELAGENT_NCU_HANDSHAKE" ] || exit 9; echo KERNELAGENT_NCU_READY; '
              'while [ ! -e kernelagent-go ]; do sleep 0.01; done; echo "KERNELAGENT_NCU_DONE {}"; sleep 1; '
              'echo profiled')
    started = time.monotonic()
    proc = ncu_mod.run_session(["sh", "-c", script], tmp_path, dict(_os.environ), 30, None, slot)
    assert proc is not None and proc.returncode == 0, proc
    assert "profiled" in proc.stdout and events[0] == ("enter", False) and events[1][0] == "exit"
    assert events[1][1] - started >= 1.0  # held past the DONE line, to the session's end


def test_sessions_start_up_side_by_side_and_profile_one_at_a_time(tmp_path):
    """Under the server, the host's ncu lock covers only a session's profiled part (READY to its
    end), taken before the device slot: two sessions' start-ups (ncu, the interpreter, torch's
    import: most of a session's seconds) overlap, their profiled parts never do, and waiting for
    the lock is not counted in a session's own time limit."""
    import contextlib
    import os as _os
    import threading
    import time

    held: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def slot():
        start = time.monotonic()
        yield
        held.append((start, time.monotonic()))

    script = ('sleep 1; date +%s.%N > ready-at; echo KERNELAGENT_NCU_READY; '
              'while [ ! -e kernelagent-go ]; do sleep 0.01; done; sleep 1.5; echo profiled')
    results = {}

    def session(name):
        cwd = tmp_path / name
        cwd.mkdir()
        results[name] = ncu_mod.run_session(["sh", "-c", script], cwd, dict(_os.environ), 2.8, None,
                                             ncu_mod.with_the_lock(slot, 30))

    threads = [threading.Thread(target=session, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # each session's own time (1 s start-up + 1.5 s profiled) fits its 2.8 s limit; the wait for
    # the other's profiled part (1.5 s) does not count against it
    assert all(r is not None and "profiled" in r.stdout for r in results.values()), results
    (a0, a1), (b0, b1) = sorted(held)
    assert a1 <= b0, held  # one profiled part at a time
    ready = sorted(float((tmp_path / n / "ready-at").read_text()) for n in ("a", "b"))
    wall_now, mono_now = time.time(), time.monotonic()
    first_exit_wall = wall_now - (mono_now - a1)
    assert ready[1] < first_exit_wall, (ready, first_exit_wall)  # the second started up meanwhile


def test_a_session_that_cannot_have_the_lock_is_killed_and_says_so(tmp_path):
    import os as _os

    with ncu_mod.ncu_lock(1) as got:
        assert got
        script = 'echo KERNELAGENT_NCU_READY; sleep 60'
        with pytest.raises(ncu_mod.NcuBusy):
            ncu_mod.run_session(["sh", "-c", script], tmp_path, dict(_os.environ), 30, None,
                                 ncu_mod.with_the_lock(lambda: contextlib.nullcontext(), 0.3))


def test_profiled_calls_that_hold_the_slot_too_long_are_killed(tmp_path, monkeypatch):
    import contextlib
    import os as _os
    import time

    from kernelagent.harness.server import ncu_session

    monkeypatch.setattr(ncu_session, "PROFILED_HOLD_S", 1.0)
    held = []

    @contextlib.contextmanager
    def slot():
        start = time.monotonic()
        yield
        held.append(time.monotonic() - start)

    script = 'echo KERNELAGENT_NCU_READY; sleep 60'
    started = time.monotonic()
    proc = ncu_mod.run_session(["sh", "-c", script], tmp_path, dict(_os.environ), 30, None, slot)
    assert proc is None and held and held[0] < 5 and time.monotonic() - started < 20


def test_ncu_entry_runs_nothing_of_the_candidates_before_the_go(tmp_path, monkeypatch, capsys):
    """child/ncu_entry.py's side of the handshake: READY, then wait for the server's go file
    (created while it holds the slot); `kernelagent profile` (no handshake) does not wait."""
    import threading
    import time

    from kernelagent.harness.child import ncu_entry

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNELAGENT_NCU_HANDSHAKE", raising=False)
    ncu_entry._wait_for_the_device()  # returns at once
    monkeypatch.setenv("KERNELAGENT_NCU_HANDSHAKE", "1")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (ncu_entry._wait_for_the_device(), done.set()))
    thread.start()
    time.sleep(0.3)
    assert not done.is_set() and "KERNELAGENT_NCU_READY" in capsys.readouterr().out
    (tmp_path / ncu_entry.GO_FILE).touch()
    thread.join(5)
    assert done.is_set()


RUN_AS_NCU = """#!/bin/sh
r="UID=$(id -u) OUTER=$(tr -s ' ' < /proc/self/uid_map | tr '\\n' ';')"
if cat {secret} >/dev/null 2>&1; then r="$r ROOTFILE=readable"; else r="$r ROOTFILE=unreadable"; fi
if touch report-probe 2>/dev/null; then r="$r SCRATCH_WRITABLE=yes"; else r="$r SCRATCH_WRITABLE=no"; fi
echo "$r"
exit 3
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root caller has another uid to give the session")
def test_the_session_can_run_as_the_jobs_unprivileged_uid(tmp_path, monkeypatch):
    """run_as (server/evidence.py session_uid, opt-in until a GPU run shows ncu reads the counters
    as that uid): the session runs as uid 65534, cannot read a root-only file the view shows, and
    can still write its report into its scratch."""
    if not ncu_mod.namespaces_work():
        pytest.skip("kernel namespaces do not work on this machine")
    secret = Path(f"/etc/ka-ncu-canary-{os.getpid()}")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"rootonly\n")
    os.close(fd)
    try:
        tmp_path.chmod(0o755)  # pytest's 0700: where ncu really lives (/usr/local/cuda) any uid may read
        ncu = tmp_path / "ncu"
        ncu.write_text(RUN_AS_NCU.replace("{secret}", str(secret)))
        ncu.chmod(0o755)
        monkeypatch.setenv("KERNELAGENT_NCU", str(ncu))
        real_which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
        as_job = ncu_mod.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=60,
                                 scratch_parent=tmp_path, namespaces=True, run_as=(65534, 65534))["unavailable"]
        as_root = ncu_mod.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=60,
                                  scratch_parent=tmp_path, namespaces=True)["unavailable"]
    finally:
        secret.unlink()
    assert "UID=65534" in as_job and "65534 65534 1" in as_job, as_job
    assert "ROOTFILE=unreadable" in as_job and "SCRATCH_WRITABLE=yes" in as_job, as_job
    assert "ROOTFILE=readable" in as_root, as_root  # what the opt-in closes (uid 0 outside)

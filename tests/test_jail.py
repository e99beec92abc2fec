"""The per-job jail (kernelagent/harness/jail/namespaces.py) under attack.

tests/jail_attacks.py plays the trusted caller (a canary secret in its environment) and the
harness server (scrubbed environment), forks one job per attack; each job enters the jail and
attacks. The whole run is repeated in each layer this machine offers:
  direct: the server runs as the caller's user (root here, as on the GPU machine);
  bwrap:  the server runs under jail/sandbox.py's bubblewrap prefix (as root: capabilities
          dropped, uid 1000 in a user namespace), the jail nests inside it;
  nobody: the server runs as uid 65534 (an unprivileged caller), where root can switch to it.
A "none" run is the control: the same attacks succeed without the jail, so these checks can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from pathlib import Path

TESTS = Path(__file__).resolve().parent

# One worker under pytest-xdist: the module fixture runs every attack in each layer once.
pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="Linux namespaces"), pytest.mark.xdist_group("jail")]
SCRIPT = TESTS / "jail_attacks.py"
LAYERS = ["direct", "bwrap", "nobody"]


def nobody_cannot_run(script: Path) -> str | None:
    """Why uid 65534 cannot run `script` with this Python and this checkout's kernelagent (a clone
    under a folder only root may enter, such as /root or a `mktemp -d`), or None. Issue 56: the
    nobody layer's cases errored with `Permission denied` there; they are skipped, saying why."""
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", sys.executable,
                            "-c", "import sys; open(sys.argv[1]).close(); import kernelagent.harness.jail.mounts",
                            str(script)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(script.resolve().parents[1])})
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    return (f"uid 65534 cannot run {script} from this checkout ({last[:160]}): clone into a folder every user "
            "may enter to run the nobody layer")


def run_layer(layer: str, mode: str = "namespaces", attacks: list[str] | None = None) -> dict:
    if layer == "bwrap" and not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    if layer == "nobody" and (os.geteuid() != 0 or not shutil.which("setpriv")):
        pytest.skip("needs root and setpriv to run the server as uid 65534")
    if layer == "nobody" and (why := nobody_cannot_run(SCRIPT)):
        pytest.skip(why)
    env = {**os.environ, "KA_TEST_CANARY": f"canary-{uuid.uuid4().hex}"}
    cmd = [sys.executable, str(SCRIPT), "caller", "--layer", layer, "--mode", mode]
    for a in attacks or []:
        cmd += ["--attack", a]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert "error" not in out, out.get("error")
    if "skip" in out:
        pytest.skip(out["skip"])
    for name, report in out.items():
        assert "error" not in report, f"{name}: {report['error']}"
    return out


@pytest.fixture(scope="module", params=LAYERS)
def attacks(request):
    return request.param, run_layer(request.param)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_a_checkout_nobody_may_read_is_a_skip_with_its_reason(tmp_path):
    closed = tmp_path / "closed"
    (closed / "tests").mkdir(parents=True)
    os.chmod(closed, 0o700)
    copy = closed / "tests" / "jail_attacks.py"
    shutil.copy(SCRIPT, copy)
    why = nobody_cannot_run(copy)
    assert why and "Permission denied" in why and "clone into a folder every user may enter" in why


def test_jail_description(attacks):
    layer, out = attacks
    desc = out["processes"]["jail"]
    assert desc["mode"] == "namespaces" and desc["isolated"] is True
    assert set(desc["namespaces"]) == {"user", "mount", "pid", "net", "ipc", "uts"}
    assert desc["readonly_root"] == "mount_setattr"
    assert out["writes_remount_fallback"]["jail"]["readonly_root"] == "remount"
    assert desc["nested_namespaces_blocked"][:3] == ["user", "mnt", "pid"]
    assert desc["fds_kept"][:3] == [0, 1, 2]


def test_sees_only_its_own_processes(attacks):
    _, out = attacks
    child = out["processes"]["child"]
    assert child["pids"] == [1] and child["me"] == 1 and child["ppid"] == 0
    assert child["kill_server"] == "ESRCH"
    assert child["caller_proc"] is False


@pytest.mark.parametrize("attack", ["writes", "writes_remount_fallback"])
def test_cannot_write_outside_scratch(attacks, attack):
    _, out = attacks
    child, parent = out[attack]["child"], out[attack]["parent"]
    blocked = {k: v for k, v in child.items() if k not in ("scratch", "scratch_relative", "dev_null", "cwd")}
    assert blocked and all(v in ("EROFS", "EACCES", "EPERM") for v in blocked.values()), blocked
    assert child["scratch"] == child["scratch_relative"] == child["dev_null"] == "ok"
    assert parent["victim"] == "original" and parent["outside"] == ["victim.txt"]
    assert not parent["etc"] and not parent["tmp"]
    assert {"mine.txt", "mine2.txt"} <= set(parent["scratch"])


def test_hidden_directories_are_empty(attacks):
    _, out = attacks
    child = out["hidden"]["child"]
    assert child["listdir"] == [] and child["read"] == "ENOENT" and child["proc_self_root"] == "ENOENT"
    assert child["other_job"] == "ENOENT"
    assert child["scratch_root_listing"] == ["job-hidden"]  # only the job's own mount point
    assert child["write_hidden"] == "EROFS"


def test_cannot_mount_or_make_namespaces(attacks):
    _, out = attacks
    child = out["mounts"]["child"]
    assert all(v in ("EPERM", "ENOSPC", "EACCES") for v in child.values()), child
    assert child["unshare_user"] == "ENOSPC"  # the nested-namespace limit, before any capability check


def test_no_network(attacks):
    _, out = attacks
    child = out["network"]["child"]
    assert child["loopback"] == child["external"] == child["udp_external"] == "ENETUNREACH"
    assert child["abstract_unix"] == "ECONNREFUSED"  # the server's abstract socket is in another netns
    assert child["interfaces"] == ["lo"]


def test_dev_shm_is_private_and_gone(attacks):
    _, out = attacks
    child, parent = out["shm"]["child"], out["shm"]["parent"]
    assert child["before"] == []  # the server's marker segment is not visible
    assert "kernelagent-jail-leak" in child["after"]
    assert parent == {"leak": False, "seg": False, "marker_still_there": True}


@pytest.mark.parametrize("attack", ["daemon", "kill_waiter"])
def test_setsid_daemon_dies_with_the_job(attacks, attack):
    _, out = attacks
    assert out[attack]["parent"] == {"canary_pipe_eof": True, "daemon_alive_by_comm": False}
    if attack == "kill_waiter":
        assert out[attack]["status"] == -9


def test_inherited_fds_are_closed(attacks):
    _, out = attacks
    child = out["fds"]["child"]
    assert child["fstat"] == child["send"] == "EBADF"
    assert out["fds"]["parent"]["received"] == ""
    assert len(child["open_fds"]) == 6  # 0, 1, 2, the listing's own fd, the two kept pipes


def test_caller_environment_unreachable(attacks):
    _, out = attacks
    child = out["secrets"]["child"]
    assert child["found"] == [] and child["readable"] > 0 and child["in_os_environ"] is False
    assert child["caller_environ"] == "ENOENT"


def test_no_capabilities(attacks):
    _, out = attacks
    child = out["caps"]["child"]
    for key in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        assert int(child[key], 16) == 0, (key, child[key])
    assert child["NoNewPrivs"] == "1" and child["setgroups"] == "EPERM"


def test_process_limit(attacks):
    layer, out = attacks
    limits = out["nproc"]["jail"]["limits"]
    if layer == "nobody":
        assert out["nproc"]["child"]["refused"] > 0 and out["nproc"]["child"]["forked"] < 16
    else:  # root outside: the kernel exempts uid 0, and the jail says so
        assert str(limits["nproc"]).startswith("not enforced")
    if layer == "direct":  # run_as switches a root server's job to uid 65534: then it holds
        assert out["nproc_run_as"]["child"]["refused"] > 0
        assert out["nproc_run_as"]["jail"]["outer_uid"] == 65534


def test_exit_status_is_forwarded(attacks):
    _, out = attacks
    assert out["exit_status"]["status"] == 7
    assert out["segv_status"]["status"] == -11


def test_controls_without_the_jail():
    """mode none: the same attacks get through, so the checks above can fail."""
    out = run_layer("direct", "none", ["processes", "hidden", "daemon", "fds", "network"])
    assert out["processes"]["jail"]["isolated"] is False
    assert len(out["processes"]["child"]["pids"]) > 1
    assert out["hidden"]["child"]["read"] == "ok"
    assert out["daemon"]["parent"]["daemon_alive_by_comm"] is True  # it was killed by the test
    assert out["network"]["child"]["loopback"] == "ok"
    assert out["fds"]["child"]["fstat"] == "EBADF"  # fds are closed in every mode


def test_probe_reports_what_works():
    from kernelagent.harness.jail import probe as jail_probe

    info = jail_probe.probe()
    assert info["namespaces_work"] is True, info
    assert info["user_ns"] is True and info["mount_setattr"] == "works"
    assert info["jail"]["capabilities"].startswith("none")


def test_bwrap_prefix_probes_both_layers(tmp_path):
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    from kernelagent.harness.jail.sandbox import bubblewrap_prefix

    prefix = bubblewrap_prefix(tmp_path)
    assert prefix is not None
    if os.geteuid() == 0:
        assert "--cap-drop" in prefix.argv and prefix.info["uid"] != 0
    assert "--disable-userns" not in prefix.argv
    assert prefix.info["jail"]["namespaces_work"] is True, prefix.info["jail"]
    assert prefix.info["jail"]["in_bubblewrap"] is True


def test_bad_arguments_raise(tmp_path):
    from kernelagent.harness.jail import namespaces as jail

    with pytest.raises(ValueError):
        jail.enter_job_jail(tmp_path, [], [], "sandbox")


def _mount_error(err: int):
    from kernelagent.harness.jail import mounts

    exc = mounts.JailError(f"mount: {os.strerror(err)}")
    exc.errno = err  # as mounts.check_errno raises it
    return exc


def test_a_hide_path_that_vanishes_while_the_jail_is_made_is_skipped(tmp_path, monkeypatch):
    """A directory to hide that another process removes between the hide list and the mount is
    nothing to hide: the job starts (it was 'the candidate's sandbox could not be set up' when a
    neighbour test removed its canary directory meanwhile). Anything else still fails the jail."""
    import errno

    from kernelagent.harness.jail import mounts

    mounted = []
    monkeypatch.setattr(mounts, "mount", lambda src, target, fstype, flags, data=None: mounted.append(
        (str(target), fstype)))
    assert mounts._hide_one(tmp_path / "never-there", False) is False
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(mounts.JailError, match="not a directory"):
        mounts._hide_one(tmp_path / "a-file", False)
    # A top-level directory the jail listed itself, since replaced by a file: skipped as every
    # top-level file is (another process's passing file failed this job: a CI flake).
    assert mounts._hide_one(tmp_path / "a-file", False, listed=True) is False
    assert mounts.hide_all([tmp_path / "a-file"], None, frozenset({tmp_path / "a-file"})) == [] and mounted == []
    there = tmp_path / "there"
    there.mkdir()
    assert mounts._hide_one(there, False) is True and mounted == [(str(there), "tmpfs")]

    def removed_then_enoent(src, target, fstype, flags, data=None):
        Path(target).rmdir()
        raise _mount_error(errno.ENOENT)

    monkeypatch.setattr(mounts, "mount", removed_then_enoent)
    going = tmp_path / "going"
    going.mkdir()
    assert mounts._hide_one(going, False) is False

    def refused(src, target, fstype, flags, data=None):
        raise _mount_error(errno.EPERM)

    monkeypatch.setattr(mounts, "mount", refused)
    with pytest.raises(mounts.JailError):
        mounts._hide_one(there, False)  # a mount that fails for another reason is the jail's failure


def test_a_hidden_directory_removed_or_made_again_before_it_is_sealed(tmp_path, monkeypatch):
    """Sealing a hiding tmpfs read-only fails (ENOENT, EINVAL) when the host removed the directory
    meanwhile, taking our tmpfs with it: gone, it is dropped; made again, it is hidden and sealed
    again; with a bound-back path under it, or failing for another reason, the jail fails."""
    import errno

    from kernelagent.harness.jail import mounts

    calls = []
    gone, again, kept = tmp_path / "gone", tmp_path / "again", tmp_path / "kept"
    for d in (gone, again, kept):
        d.mkdir()
    failed_once = set()

    def fake_mount(src, target, fstype, flags, data=None):
        target = Path(target)
        calls.append((target.name, "tmpfs" if fstype else "seal"))
        if fstype is None and target in (gone, again) and target not in failed_once:
            failed_once.add(target)
            if target == gone:
                target.rmdir()
            raise _mount_error(errno.EINVAL if target == again else errno.ENOENT)

    monkeypatch.setattr(mounts, "mount", fake_mount)
    assert mounts.seal([gone, again, kept], None, []) == [again, kept]
    assert calls == [("gone", "seal"), ("again", "seal"), ("again", "tmpfs"), ("again", "seal"), ("kept", "seal")]
    failed_once.clear()
    with pytest.raises(mounts.JailError, match="bound back under it"):
        mounts.seal([again], None, [again / "venv"])
    monkeypatch.setattr(mounts, "mount", lambda *a, **k: (_ for _ in ()).throw(_mount_error(errno.EPERM)))
    with pytest.raises(mounts.JailError):
        mounts.seal([kept], None, [])
    assert mounts.seal([kept], kept, []) == [kept]  # a private /tmp is never sealed


@pytest.mark.skipif(os.geteuid() != 0, reason="makes directories in /")
def test_jobs_start_while_the_host_makes_and_removes_directories_to_hide():
    """The race behind a CI flake (a crashed candidate reported as a harness error): 200 jails
    made while a thread makes and removes top-level directories on the hide list. Before the fix,
    about half failed (mount ENOENT, remount EINVAL or ENOENT, 'not a directory')."""
    done = subprocess.run([sys.executable, str(TESTS / "jail_churn.py"), "200"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    if out["made"] == 0 and len(out["failures"]) == 1 and "unshare" in next(iter(out["failures"])):
        pytest.skip(f"no user namespaces here: {out['failures']}")
    assert out == {"made": 200, "failures": {}}


def test_top_level_directories_made_after_the_server_started_are_hidden_from_later_jobs(tmp_path, monkeypatch):
    """A job entering its jail lists the top-level directories to hide then, not at the
    server's start: one made since is hidden too (a harness serves jobs for hours), and they
    go as `listed_tops`, apart from the paths a caller named (which must stay directories)."""
    from kernelagent.harness.jail import candidate as jail
    from kernelagent.harness.jail import namespaces

    monkeypatch.setattr(jail, "hidden_tops", lambda: [Path("/srv"), Path("/ka-made-later")])
    assert jail.tops_now([Path("/srv"), Path("/home/u")]) == [Path("/ka-made-later")]
    seen = {}
    monkeypatch.setattr(namespaces, "enter_job_jail", lambda workdir, hide, keep_fds, mode, **k: seen.update(
        hide=hide, mode=mode, tops=k.get("listed_tops")) or {"mode": mode})
    monkeypatch.setattr(os, "dup2", lambda *a: None)  # enter() points fds 1 and 2 at the job's log
    jail.enter(tmp_path, {"mode": "namespaces", "hide": ["/home/u"], "keep_ro": []}, [], tmp_path / "log")
    assert seen == {"hide": [Path("/home/u")], "mode": "namespaces", "tops": [Path("/srv"), Path("/ka-made-later")]}


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a directory in /")
def test_a_jail_that_cannot_be_made_is_a_harness_error_that_says_why(tmp_path):
    """The candidate's process could not enter its jail (exit 70 before any candidate code): a
    harness error, never the candidate's failure, whose reason carries the jail's own line (it
    was only in the log, and a CI flake could not be traced from the result). Only a server that
    NAMED the directory fails so: to every other one it is a top-level directory the jail listed
    itself, and a file in its place is a top-level file, not hidden and no failure (this test's
    file failed another test's jobs on CI, running beside it)."""
    from kernelagent.harness import EvalConfig, Evaluator, Status
    from tests.conftest import CANDIDATES, read

    hidden = Path(f"/ka-jail-test-{uuid.uuid4().hex[:12]}")  # a top-level directory: hidden by itself
    hidden.mkdir()
    config = EvalConfig(trials=1, baselines=False, seed=3)
    try:
        with Evaluator(device="cpu", cache_dir=tmp_path / "cache", isolation="namespaces", hide=[hidden]) as ev, \
                Evaluator(device="cpu", cache_dir=tmp_path / "other", isolation="namespaces") as other:
            for evaluator in (ev, other):
                first = evaluator.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), config)
                assert first.status == Status.CORRECT, first.reason
            hidden.rmdir()
            hidden.write_text("now a file")  # the server listed it as a directory to hide
            broken = ev.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "segfaults.py"), config)
            beside = other.evaluate(CANDIDATES / "relu_problem.py", read(CANDIDATES / "segfaults.py"), config)
    finally:
        if hidden.is_dir():
            hidden.rmdir()
        else:
            hidden.unlink(missing_ok=True)
    assert beside.status not in (Status.HARNESS_ERROR, Status.CORRECT), (beside.status, beside.stage, beside.reason)
    assert broken.status == Status.HARNESS_ERROR and broken.stage == "start"
    assert broken.reason.startswith("the candidate's sandbox could not be set up: ")
    assert f"hide path {hidden} is not a directory" in broken.reason, broken.reason

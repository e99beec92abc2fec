"""Issue 54 (trust round 5), classes 1 and 7: a trusted process runs only installed code, and the
host resources this user's processes share are this user's alone.

Class 1: `python -m` put the working directory first on the server's sys.path, so an
`argparse.py` in the folder where `kernelagent verify` ran executed inside the harness server
(it forged a PASS), through MCP with `--root .` too, and a warm harness kept it for later
commands. Every trusted interpreter now starts isolated (`-I`, interpreter.module_argv) in a
folder of its own; the server refuses a foreign import path; the warm harness's key says what it
imports from. Class 7: the Nsight Compute lock files sat straight in /tmp, where another local
user could make them first; they (and the warm harness's sockets) live in folders only this uid
can write (private_dir.py). The rows pair with docs/concepts/isolation.md and defences.md.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kernelagent.harness import interpreter, private_dir
from kernelagent.harness.caller import daemon
from kernelagent.harness.server import ncu_session
from tests.conftest import CANDIDATES, REPO

# A module named like the standard library's: it leaves a marker (the pid that imported it),
# then hands over to the real module, so that a process it ran in works on and its verdict
# would look honest: only the marker tells.
POISON = '''\
import os as _os, sys as _sys
with open({marker!r}, "a") as _f:
    _f.write(str(_os.getpid()) + " " + " ".join(_sys.argv)[:200] + "\\n")
_here = _os.path.dirname(_os.path.abspath(__file__))
del _sys.modules[__name__]
_saved = list(_sys.path)
_sys.path[:] = [p for p in _sys.path if p not in ("", ".") and _os.path.abspath(p) != _here]
import importlib as _il
_real = _il.import_module(__name__)
_sys.path[:] = _saved
globals().update({{k: v for k, v in vars(_real).items() if k not in ("__file__", "__spec__", "__loader__")}})
_sys.modules[__name__] = _real
'''


def _poisoned_folder(tmp_path: Path, *names: str) -> tuple[Path, Path]:
    folder = tmp_path / "kernels"
    folder.mkdir()
    marker = tmp_path / "MARKER"
    for name in names:
        (folder / f"{name}.py").write_text(POISON.format(marker=str(marker)))
    return folder, marker


def _cli() -> list[str]:
    """The installed `kernelagent` command (the user's own process: its folder is the venv's
    bin, not the working directory), else `python -P -m kernelagent` (3.11+)."""
    exe = shutil.which("kernelagent", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if exe:
        return [exe]
    if sys.version_info < (3, 11):
        pytest.skip("no `kernelagent` command and no -P here")
    return [sys.executable, "-P", "-m", "kernelagent"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KERNELAGENT_SERVER_ZYGOTE"}  # a server of its own
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", KERNELAGENT_CACHE_DIR=str(tmp_path / "cache"),
               NO_COLOR="1", **extra)
    return env


# ---------------------------------------------------------------------------------------------
# Class 1: a stdlib-named module in the working folder never runs in a trusted process.

@pytest.mark.parametrize("module, warm", [
    ("argparse", False),  # the server's own argument parser: the instance
    ("json", True),       # the protocol's codec, in a warm harness that later commands reuse
])
def test_a_stdlib_named_module_in_the_working_folder_never_runs_in_the_server(tmp_path, module, warm):
    folder, marker = _poisoned_folder(tmp_path, module)
    extra = {"KERNELAGENT_RUNTIME_DIR": str(tmp_path / "run"), "KERNELAGENT_DAEMON_IDLE_S": "5"} if warm else {}
    args = [*_cli(), "eval", str(CANDIDATES / "relu_problem.py"), str(CANDIDATES / "relu_wrong.py"), "--json",
            "--device", "cpu", "--trials", "1", *(["--daemon"] if warm else [])]
    proc = subprocess.run(args, cwd=folder, env=_env(tmp_path, **extra), capture_output=True, text=True, timeout=400)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        pid = None
        if warm and proc.stdout.strip():
            try:
                pid = (json.loads(proc.stdout.strip().splitlines()[-1]).get("isolation") or {}).get("daemon", {}).get("pid")
            except ValueError:
                pid = None
        if isinstance(pid, int) and pid > 1:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    assert not marker.exists(), f"{module}.py of the working folder ran in: {marker.read_text()}"
    assert result["status"] == "incorrect", (result["status"], result.get("reason"), proc.stderr[-2000:])
    if warm:
        assert result["isolation"]["daemon"]["started_now"] is True


def test_an_mcp_root_that_is_the_working_folder_runs_nothing_of_it(tmp_path):
    """`kernelagent mcp --root .` as the guide shows it: the client may write files there (a
    `json.py`); the harness server the MCP server starts runs none of them."""
    pytest.importorskip("mcp")
    from mcp import ClientSession, StdioServerParameters, stdio_client

    folder, marker = _poisoned_folder(tmp_path, "argparse", "json")
    cli = _cli()
    env = {k: v for k, v in _env(tmp_path).items() if k in ("PATH", "HOME", "PYTHONPATH", "CUDA_VISIBLE_DEVICES",
                                                             "KERNELAGENT_CACHE_DIR", "TRITON_INTERPRET",
                                                             "KERNELAGENT_DAEMON")}
    params = StdioServerParameters(command=cli[0], args=[*cli[1:], "mcp", "--problems", str(CANDIDATES), "--root",
                                                         ".", "--device", "cpu"], env=env, cwd=str(folder))

    async def body():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("evaluate", {"problem": "relu_problem.py", "code":
                                                            (CANDIDATES / "relu_wrong.py").read_text(), "trials": 1})

    result = asyncio.run(asyncio.wait_for(body(), 400))
    assert not marker.exists(), f"a module of the MCP root ran in: {marker.read_text()}"
    assert result.structured_content["status"] == "incorrect", result.content


@pytest.mark.parametrize("how, expected", [
    ("python -m, in a folder of its own", "working"),   # the working folder first on the path
    ("PYTHONPATH with a folder of the user's", "foreign"),  # a folder outside the installation
])
def test_the_server_refuses_to_start_on_a_foreign_import_path(tmp_path, how, expected):
    """Started any other way than interpreter.module_argv, the server says so in one line and
    exits 2 before it parses a word of its command line."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KERNELAGENT_SERVER_ZYGOTE"}
    if how.startswith("python -m"):
        env["PYTHONPATH"] = str(REPO)
        argv = [sys.executable, "-m", "kernelagent.harness.server", "--device", "cpu"]
        entry = str(elsewhere)
    else:
        if sys.version_info < (3, 11):
            pytest.skip("-P is Python 3.11's")
        env["PYTHONPATH"] = f"{elsewhere}{os.pathsep}{REPO}"
        argv = [sys.executable, "-P", "-s", "-c", "import runpy; runpy.run_module('kernelagent.harness.server', "
                "run_name='__main__', alter_sys=True)", "--device", "cpu"]
        entry = str(elsewhere)
    proc = subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == interpreter.REFUSED_EXIT and len(lines) == 1, (expected, proc.stderr[-1500:])
    assert "harness server refuses to start" in lines[0] and entry in lines[0], lines[0]


@pytest.mark.parametrize("entry, foreign", [
    ("", True), (".", True), ("<cwd>", True), ("<tmp>", True),
    ("<stdlib>", False), ("<site>", False), ("<package root>", False),
    ("__editable__.kernelagent-0.1.0.finder.__path_hook__", False),
])
def test_what_counts_as_this_installation(tmp_path, entry, foreign):
    import sysconfig

    where = {"<cwd>": str(tmp_path), "<tmp>": tempfile.gettempdir(), "<stdlib>": sysconfig.get_paths()["stdlib"],
             "<site>": sysconfig.get_paths()["purelib"], "<package root>": str(interpreter.PACKAGE_ROOT)}
    path = where.get(entry, entry)
    assert bool(interpreter.foreign_entries([path], cwd=str(tmp_path))) is foreign


def test_every_trusted_spawn_goes_through_the_one_helper():
    """No `sys.executable` command line of our own modules (or -c code) is built anywhere but
    interpreter.py: each of them would put a folder of the user's on a trusted path."""
    import re

    pattern = re.compile(r"\[\s*sys\.executable\s*,\s*['\"]-[mc]['\"]")
    found = [f"{p.relative_to(REPO)}:{n}" for p in sorted((REPO / "kernelagent").rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, found


def test_a_trusted_child_imports_our_package_from_a_folder_with_its_own(tmp_path):
    """A `kernelagent/` and a `json.py` in the folder it starts from change nothing: the child
    imports the package of the files that started it, and the standard library's json."""
    (tmp_path / "kernelagent").mkdir()
    (tmp_path / "kernelagent" / "__init__.py").write_text("raise SystemExit('the wrong kernelagent')\n")
    (tmp_path / "json.py").write_text("raise SystemExit('the wrong json')\n")
    code = "import json, sys, kernelagent; print(json.dumps([kernelagent.__file__, sys.flags.isolated]))"
    proc = subprocess.run(interpreter.code_argv(code), cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-1000:]
    where, isolated = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(where).resolve() == interpreter.PACKAGE_DIR / "__init__.py" and isolated == 1


SETTINGS = ["cpu", "None", "auto", "", "", "0", "/cache", "False", "False"]


@pytest.mark.parametrize("change, differs", [
    ("a site-packages folder more", True),  # what the interpreter imports from
    ("the package elsewhere", True),
    ("LD_LIBRARY_PATH", True),               # what the server's libraries load
    ("this command's scratch folder", False),  # TMPDIR: each command's own
    ("the terminal's width", False),
    ("PYTHONPATH", False),                   # -I ignores it
])
def test_the_warm_harness_key_says_what_it_imports_from(tmp_path, monkeypatch, change, differs):
    import site

    scratch = tmp_path / "scratch-a"
    env = {"PATH": "/usr/bin", "TMPDIR": str(scratch), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
           "PYTHONPATH": "/x", "COLUMNS": "80"}
    before = daemon.key(SETTINGS, env, scratch)
    other, other_scratch = dict(env), scratch
    if change == "a site-packages folder more":
        extra = tmp_path / "site"
        extra.mkdir()
        real = site.getsitepackages()
        monkeypatch.setattr(site, "getsitepackages", lambda *a: [*real, str(extra)])
    elif change == "the package elsewhere":
        monkeypatch.setattr(interpreter, "PACKAGE_DIR", tmp_path / "kernelagent")
    elif change == "LD_LIBRARY_PATH":
        other["LD_LIBRARY_PATH"] = str(tmp_path)
    elif change == "this command's scratch folder":
        other_scratch = tmp_path / "scratch-b"
        other.update(TMPDIR=str(other_scratch), TORCHINDUCTOR_CACHE_DIR=str(other_scratch / "inductor"))
    elif change == "the terminal's width":
        other["COLUMNS"] = "200"
    elif change == "PYTHONPATH":
        other["PYTHONPATH"] = "/y"
    assert (daemon.key(SETTINGS, other, other_scratch) != before) is differs


# ---------------------------------------------------------------------------------------------
# Class 7: the lock folder and the socket folder are this user's alone.

def _nobody() -> int:
    if os.getuid() != 0:
        pytest.skip("making a folder of another user's needs root")
    return 65534


@pytest.mark.parametrize("how, refused", [
    ("0700, ours", False),
    ("0755, ours", False),                 # others may look, not write
    ("0775: its group may write", True),
    ("0777: anyone may write", True),
    ("1777: sticky and world-writable, as /tmp", True),
    ("owned by another user", True),
    ("a link to a folder of ours", True),
])
def test_the_ncu_lock_folder_is_used_only_while_it_is_ours_alone(tmp_path, monkeypatch, how, refused):
    where = tmp_path / "locks"
    if how.startswith("a link"):
        (tmp_path / "real").mkdir(mode=0o700)
        where.symlink_to(tmp_path / "real")
    else:
        where.mkdir()
        mode = int(how.split(",")[0].split(":")[0], 8) if how[0].isdigit() else 0o700
        os.chmod(where, mode)
        if how == "owned by another user":
            os.chown(where, _nobody(), _nobody())
    monkeypatch.setenv("KERNELAGENT_NCU_LOCK_DIR", str(where))
    if not refused:
        with ncu_session.ncu_lock(1.0, "uuid:gpu-a") as held:
            assert held
        assert ncu_session.ncu_lock_path().parent == where
        return
    with pytest.raises(ncu_session.NcuLockRefused) as caught:
        with ncu_session.ncu_lock(1.0, "uuid:gpu-a"):
            pass
    assert str(where) in str(caught.value) and "\n" not in str(caught.value)
    said = ncu_session.unavailable(caught.value, 1.0)["unavailable"]
    assert str(where) in said and "held" not in said  # why, not "busy"
    from kernelagent.errors import UserError

    with pytest.raises(UserError, match="KERNELAGENT_NCU_LOCK_DIR"):  # named by the user: one line
        ncu_session.lock_dir_for_servers()


def test_a_lock_file_squatted_in_the_shared_temp_folder_stops_no_session(tmp_path, monkeypatch):
    """Another user makes this user's lock file first in the sticky temp folder, and holds it:
    our sessions use a private folder and never wait for theirs."""
    nobody = _nobody()
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv("KERNELAGENT_NCU_LOCK_DIR", raising=False)
    squatted = shared / f"kernelagent-ncu-{os.getuid()}.lock"
    squatted.write_text("")
    os.chown(squatted, nobody, nobody)
    fd = os.open(squatted, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # theirs, held for as long as they like
        with ncu_session.ncu_lock(0.5) as held:
            assert held
        folder = ncu_session.ncu_lock_path().parent
        info = os.lstat(folder)
        assert folder != shared and info.st_uid == os.getuid() and not info.st_mode & 0o022
    finally:
        os.close(fd)


def test_a_squatted_user_folder_gives_the_servers_a_fresh_private_one(tmp_path, monkeypatch):
    nobody = _nobody()
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv("KERNELAGENT_NCU_LOCK_DIR", raising=False)
    monkeypatch.setattr(ncu_session, "_FRESH", [])
    theirs = private_dir.default_user_dir()
    theirs.mkdir(mode=0o755)
    os.chown(theirs, nobody, nobody)
    with pytest.raises(private_dir.NotPrivate, match="belongs to uid 65534"):
        ncu_session.ncu_lock_dir()
    given = ncu_session.lock_dir_for_servers()
    assert given != theirs and os.lstat(given).st_uid == os.getuid() and not os.lstat(given).st_mode & 0o077
    assert ncu_session.lock_dir_for_servers() == given  # one per process: its servers share it


@pytest.mark.parametrize("how", ["0770: its group may enter", "owned by another user"])
def test_the_socket_folder_of_another_user_is_not_used(tmp_path, monkeypatch, how):
    where = tmp_path / "run"
    where.mkdir(mode=0o700)
    if how.startswith("0770"):
        os.chmod(where, 0o770)
    else:
        os.chown(where, _nobody(), _nobody())
    monkeypatch.setenv("KERNELAGENT_RUNTIME_DIR", str(where))
    with pytest.raises(daemon.DaemonUnavailable, match="other users|belongs to uid"):
        daemon.runtime_dir()

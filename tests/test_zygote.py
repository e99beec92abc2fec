"""Harness servers forked from a zygote (kernelagent/harness/server/zygote.py, caller/zygote.py;
the suite's servers start that way, tests/server_zygote.py): the same verdicts as a server that
started its own interpreter, a session and scratch of its own, and a zygote that refuses what is
not a server's request."""

from __future__ import annotations

import json
import os
import sys

import pytest

from kernelagent.harness import EvalConfig, Evaluator, Status
from kernelagent.harness.caller import zygote
from kernelagent.harness.server.zygote import BadRequest, parse_request
from tests.conftest import CANDIDATES, read

RELU = CANDIDATES / "relu_problem.py"
CONFIG = EvalConfig(trials=1, baselines=False, seed=11, timing=False)
# A correct ReLU that prints, at import in the candidate's process, what it inherited.
PRINTS = read(CANDIDATES / "relu_good.py") + '''
import os as _os, tempfile as _tempfile
print("KA-PROCESS " + __import__("json").dumps({"tempdir": _tempfile.gettempdir(), "TMPDIR": _os.environ.get("TMPDIR")}))
'''

needs_zygote = pytest.mark.skipif(not zygote.address(), reason="no zygote in this session (KERNELAGENT_TEST_ZYGOTE=0)")


def _printed(result) -> dict:
    lines = [line for line in (result.log or "").splitlines() if line.startswith("KA-PROCESS ")]
    assert lines, result.log
    return json.loads(lines[-1][len("KA-PROCESS "):])


def _evaluate(tmp_path, name: str, source: str):
    with Evaluator(device="cpu", cache_dir=tmp_path / name) as ev:
        result = ev.evaluate(RELU, source, CONFIG)
        result.server_signals = _signals(ev._proc.pid)
        return result, ev._proc


def _signals(pid: int) -> dict[str, str]:
    """The server's signal dispositions (ignored, caught, blocked), as /proc shows them."""
    lines = open(f"/proc/{pid}/status").read().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines) if k in ("SigIgn", "SigCgt", "SigBlk")}


@needs_zygote
def test_a_forked_server_judges_as_a_server_that_started_its_own_interpreter(tmp_path, monkeypatch):
    forked, proc = _evaluate(tmp_path, "forked", read(CANDIDATES / "relu_wrong.py"))
    assert isinstance(proc, zygote.ZygoteProcess)
    monkeypatch.delenv(zygote.ENV)
    plain, proc = _evaluate(tmp_path, "plain", read(CANDIDATES / "relu_wrong.py"))
    assert not isinstance(proc, zygote.ZygoteProcess)
    assert forked.status == plain.status == Status.INCORRECT
    # A fresh interpreter's dispositions: SIGPIPE ignored above all (at its default, the server
    # died writing to a channel its candidate had closed: a harness error for a candidate's crash)
    assert forked.server_signals == plain.server_signals
    assert int(forked.server_signals["SigIgn"], 16) & (1 << (13 - 1))  # SIGPIPE
    assert [t.passed for t in forked.trials] == [t.passed for t in plain.trials]
    assert [t.max_abs_err for t in forked.trials] == [t.max_abs_err for t in plain.trials]
    assert forked.seeds["base"] == plain.seeds["base"] == 11
    same = ("mode", "run_as", "job_uid", "guarantees")
    assert {k: forked.isolation["jail"].get(k) for k in same} == {k: plain.isolation["jail"].get(k) for k in same}


@needs_zygote
def test_each_forked_server_hands_its_jobs_their_own_scratch(tmp_path):
    """Two servers from one zygote: each job's TMPDIR is its own server's, and what the job's
    tempfile module uses (a folder the zygote had looked up would be every server's)."""
    first, second = (_evaluate(tmp_path, name, PRINTS)[0] for name in ("one", "two"))
    assert first.status == second.status == Status.CORRECT, (first.reason, second.reason)
    a, b = _printed(first), _printed(second)
    for seen in (a, b):
        assert seen["TMPDIR"] and seen["tempdir"] == seen["TMPDIR"], seen
    assert a["tempdir"] != b["tempdir"]


@needs_zygote
def test_a_server_the_zygote_forked_ends_with_its_evaluator(tmp_path):
    with Evaluator(device="cpu", cache_dir=tmp_path / "c") as ev:
        assert ev.evaluate(RELU, read(CANDIDATES / "relu_good.py"), CONFIG).status == Status.CORRECT
        proc = ev._proc
        assert isinstance(proc, zygote.ZygoteProcess) and proc.poll() is None
        assert os.getsid(proc.pid) == proc.pid  # a session of its own: the evaluator's killpg ends it all
        # its own scratch root, never the caller's folder (issue 54: nothing of the user's folder reaches it)
        assert os.readlink(f"/proc/{proc.pid}/cwd") == os.path.realpath(ev._scratch_root) != os.getcwd()
    assert proc.wait(timeout=10) is not None
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)


def _request(**over) -> bytes:
    base = {"executable": sys.executable, "argv": ["--fd", "3"], "env": {"A": "b"}, "cwd": "/tmp"}
    return json.dumps({**base, **over}).encode()


@pytest.mark.parametrize("request_, why", [
    (b"not json", "not JSON"),
    (b'{"argv": [], "env": {}}', "exactly executable, argv, env and cwd"),
    (_request(executable="/usr/bin/python3-other"), "not this zygote's interpreter"),
    (_request(executable="python"), "not this zygote's interpreter"),
    (_request(argv=["--device", "cpu"]), "--fd is required"),
    (_request(env={"A=B": "x"}), "env"),
    (_request(env={"A": 1}), "env"),
    (_request(cwd="relative"), "cwd"),
    (_request(argv=["--fd", 3]), "argv"),
])
def test_the_zygote_refuses_what_is_not_a_servers_request(request_, why):
    with pytest.raises(BadRequest, match=why):
        parse_request(request_)
    assert parse_request(_request()) == (sys.executable, ["--fd", "3"], {"A": "b"}, "/tmp")


def test_an_unreachable_zygote_is_a_harness_error_not_a_silent_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv(zygote.ENV, str(tmp_path / "no-such.sock"))
    with Evaluator(device="cpu", cache_dir=tmp_path / "c") as ev:
        result = ev.evaluate(RELU, read(CANDIDATES / "relu_good.py"), CONFIG)
    assert result.status == Status.HARNESS_ERROR
    assert f"the zygote at {tmp_path / 'no-such.sock'} did not answer" in result.reason, result.reason


def test_a_process_known_by_pid_runs_until_its_pid_is_gone():
    """caller/pids.py, which a warm harness's client and a zygote-forked server (once its zygote is
    gone) both use: running while the pid names a process, then ended."""
    import subprocess
    import sys

    from kernelagent.harness.caller import pids

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    known = pids.PidProcess(proc.pid)
    assert pids.alive(proc.pid) and known.poll() is None
    assert pids.PidProcess(None).poll() is None and not pids.alive(0) and not pids.alive(-1)
    proc.kill()
    proc.wait()
    assert not pids.alive(proc.pid) and known.poll() == 0 and known.wait(1.0) == 0

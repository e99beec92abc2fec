"""The server's start-up (server/main.py): the device probe runs in a child while the server
imports Triton and torch._dynamo, on a guess about the device that the probe's answer checks; its
answer is cached per machine and versions. Issue 23, scope 2 (start fast)."""

from __future__ import annotations

import os

import pytest

from kernelagent.harness.server import device_probe
from kernelagent.harness.server import main as server_main


def test_the_guess_before_the_probe_answers(monkeypatch):
    monkeypatch.setattr(server_main.os.path, "exists", lambda p: p == "/dev/nvidiactl")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert server_main._expects_cuda("auto") and server_main._expects_cuda("cuda:1")
    assert not server_main._expects_cuda("cpu")
    for hidden in ("", "-1", " "):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not server_main._expects_cuda("auto")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert server_main._expects_cuda("auto")
    monkeypatch.setattr(server_main.os.path, "exists", lambda p: False)
    assert not server_main._expects_cuda("auto")  # no NVIDIA device node: the interpreter


def test_a_wrong_guess_runs_the_server_again_knowing_the_answer(monkeypatch):
    calls = []
    monkeypatch.setattr(server_main.os, "execv", lambda exe, argv: calls.append((exe, argv)))
    monkeypatch.setattr(server_main.sys, "argv", ["main.py", "--fd", "7", "--device", "auto"])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # set, then removed: monkeypatch then puts the variable back as it was (absent) afterwards,
    # so no server this test session starts inherits the answer
    monkeypatch.setenv(server_main.INTERPRET_KNOWN, "")
    monkeypatch.delenv(server_main.INTERPRET_KNOWN)
    server_main._restart_knowing(True)
    (exe, argv), = calls
    from kernelagent.harness import interpreter

    assert interpreter.module_of(argv) == ("kernelagent.harness.server", ["--fd", "7", "--device", "auto"])
    assert argv[1] == "-I"  # isolated: no working directory on its path
    assert os.environ[server_main.INTERPRET_KNOWN] == "cuda" and "TRITON_INTERPRET" not in os.environ


def test_the_probe_is_cached_and_says_so(tmp_path):
    if device_probe._probe_key("cpu") is None:
        pytest.skip("no key for this machine (no boot id)")
    first = device_probe.cached_probe("cpu", tmp_path)
    assert not getattr(first, "cached", False)  # probed in a child started just now
    info = first()
    assert info["probe_cached"] is False and info["cuda"] is False and "error" not in info
    again = device_probe.cached_probe("cpu", tmp_path)
    assert getattr(again, "cached", False)  # known at once: the imports need no guess
    assert again()["probe_cached"] is True and again()["torch"] == info["torch"]


def test_the_answer_is_for_one_start_only(monkeypatch):
    """A device answer meant for one restart never reaches another server: a caller's
    environment that carries it (a leak) does not pass it on, so the server probes and decides
    itself (a leaked 'cuda' once made CPU servers import Triton without the interpreter)."""
    from kernelagent.harness import Evaluator

    monkeypatch.setenv(server_main.INTERPRET_KNOWN, "cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    env = Evaluator(device="cpu")._server_env()
    assert server_main.INTERPRET_KNOWN not in env and "TRITON_INTERPRET" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # the CPU asked for: the server's guess is the interpreter


def test_a_server_says_where_its_start_went(evaluator):
    """Issue 59: the fixed cost of a cold `eval` is largely the server's start; each server's
    fingerprint says where it went, phase by phase, so a slow start can be read, not guessed."""
    start = evaluator.fingerprint()["start_s"]
    phases = ("probe_and_setup", "imports", "preload", "probe_wait", "trace_wait", "jail")
    assert set(phases) <= set(start) and "trace_build" in start
    assert all(isinstance(start[k], float) and 0 <= start[k] < 120 for k in phases)
    assert sum(start[k] for k in phases) > 0
    # the bytecode helper (server/bytecode.py) is a GPU server's: a CPU server says it did not start one
    assert evaluator.fingerprint()["bytecode"] == "not needed (no GPU)"

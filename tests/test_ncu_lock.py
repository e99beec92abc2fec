"""The Nsight Compute lock: one profiled part at a time on a device (the kernel evidence of the
servers of several GPUs profiles at once), one at a time on the host for a session without a
device (the caller's `profile`), and the same lock files for the caller and every server."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kernelagent.errors import UserError
from kernelagent.harness.server import ncu_session
from kernelagent.harness.caller.evaluator import Evaluator
from kernelagent.harness.server.evidence import ncu_lock_key


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAGENT_NCU_LOCK_DIR", str(tmp_path))
    monkeypatch.delenv("KERNELAGENT_NCU_LOCK", raising=False)
    return tmp_path


def held(key):
    """A thread holding the lock of `key` until the returned event is set."""
    got, release = threading.Event(), threading.Event()

    def hold():
        with ncu_session.ncu_lock(5, key) as ok:
            assert ok
            got.set()
            release.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert got.wait(10)
    return release, thread


def can_have(key, wait_s=0.3) -> bool:
    with ncu_session.ncu_lock(wait_s, key) as ok:
        return ok


@pytest.mark.parametrize("holder, other, expected", [
    ("uuid:gpu-a", "uuid:gpu-b", True),   # two devices: both profile at once
    ("uuid:gpu-a", "uuid:gpu-a", False),  # one device: one session at a time
    ("uuid:gpu-a", None, False),          # a host-wide session waits for every device's
    (None, "uuid:gpu-a", False),          # and every device's waits for it
    (None, None, False),
])
def test_who_waits_for_whom(holder, other, expected):
    release, thread = held(holder)
    try:
        assert can_have(other) is expected
    finally:
        release.set()
        thread.join()
    assert can_have(other, 1.0) is True  # let go: had at once


def test_the_lock_files_are_in_the_named_directory(lock_dir):
    assert ncu_session.ncu_lock_path().parent == lock_dir
    assert ncu_session.device_lock_path("uuid:gpu-a").parent == lock_dir
    assert ncu_session.device_lock_path("uuid:gpu-a") != ncu_session.device_lock_path("uuid:gpu-b")


def test_the_server_takes_its_device_lock_unless_told_host(monkeypatch):
    fingerprint = {"cuda": True, "uuid": "GPU-1234"}
    assert ncu_lock_key(fingerprint) == "uuid:gpu-1234"
    monkeypatch.setenv("KERNELAGENT_NCU_LOCK", "host")
    assert ncu_lock_key(fingerprint) is None


def test_servers_share_the_callers_lock_directory(lock_dir):
    env = Evaluator(device="cpu")._server_env(Path("/nonexistent-scratch"))
    assert env["KERNELAGENT_NCU_LOCK_DIR"] == str(lock_dir)
    assert env["TMPDIR"] == "/nonexistent-scratch"  # the server's own temp directory differs


def test_a_scope_that_is_not_one_is_a_user_error_before_any_server_starts(monkeypatch):
    monkeypatch.setenv("KERNELAGENT_NCU_LOCK", "gpu")
    with pytest.raises(UserError, match="KERNELAGENT_NCU_LOCK='gpu': expected one of device, host"):
        Evaluator(device="cpu")._server_env(Path("/nonexistent-scratch"))

"""ncu runs the candidate's code itself, outside the server's per-job jail: it must run inside
bubblewrap (the server's outer layer), and without bubblewrap only when the user asked for it
(issue 11). A fake `ncu` stands in for Nsight Compute: it reports where it ran."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from kernelagent.harness.caller import profiling
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


def test_without_bubblewrap_ncu_does_not_run_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELAGENT_NCU", str(_fake_ncu(tmp_path)))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else "/bin/" + name)
    got = profiling.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=30)
    assert got == {"unavailable": profiling.UNSANDBOXED_NCU}
    asked = profiling.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=30,
                              allow_unsandboxed=True)
    assert "PIDNS=" in asked["unavailable"]  # it ran, as asked


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed here")
def test_ncu_runs_inside_bubblewrap(tmp_path, monkeypatch):
    from kernelagent.harness.caller import sandbox

    if sandbox.bubblewrap_command(tmp_path) is None:
        pytest.skip("bubblewrap cannot create namespaces here")
    monkeypatch.setenv("KERNELAGENT_NCU", str(_fake_ncu(tmp_path)))
    got = profiling.run_ncu(CANDIDATES / "relu_problem.py", read(CANDIDATES / "relu_good.py"), timeout=30)
    text = got["unavailable"]
    assert "PIDNS=" in text, text
    ours = os.readlink("/proc/self/ns/pid")
    assert f"PIDNS={ours}" not in text  # its own pid namespace
    assert "CALLER_ENV=hidden" in text  # the caller's /proc entry is out of its sight

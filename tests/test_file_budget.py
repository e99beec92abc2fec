"""tests/file_budget.py: each GPU test file has a time budget of its own, so one file that hangs
cannot spend the whole device call and hide the others (issue 25, scope 3). Run here on the CPU
with stand-in test files marked `gpu`."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.conftest import REPO

HANGS = '''
import time, pytest

@pytest.mark.gpu
def test_hangs():
    time.sleep(60)

@pytest.mark.gpu
def test_after_the_hang():
    pass
'''

FINE = '''
import pytest

@pytest.mark.gpu
def test_fine():
    assert 1 + 1 == 2
'''

CONFTEST = "from tests.file_budget import pytest_runtest_protocol, pytest_runtest_setup  # noqa: F401\n"


def test_a_hanging_file_spends_its_own_budget_and_the_next_file_runs(tmp_path):
    (tmp_path / "test_a_hangs_gpu.py").write_text(HANGS)
    (tmp_path / "test_b_fine_gpu.py").write_text(FINE)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    env = dict(os.environ, PYTHONPATH=str(REPO), KERNELAGENT_GPU_FILE_BUDGET_S="2")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:timeout", "-p", "no:cacheprovider",
                           "-o", "addopts=", "-rA", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert wall < 40, out  # not the 60 s sleep
    assert "FAILED test_a_hangs_gpu.py::test_hangs" in out, out
    assert "ERROR test_a_hangs_gpu.py::test_after_the_hang" in out, out  # not run: the budget is spent
    assert "spent its 2 s budget" in out, out
    assert "PASSED test_b_fine_gpu.py::test_fine" in out, out
    assert "test_a_hangs_gpu.py ran past its 2 s budget" in out, out


def test_budgets_off_and_per_file(monkeypatch):
    from tests import file_budget

    monkeypatch.delenv(file_budget.ENV, raising=False)
    assert file_budget.budget_for("test_kernelbench_solutions.py") == file_budget.FILE_BUDGETS_S[
        "test_kernelbench_solutions.py"]
    assert file_budget.budget_for("test_other_gpu.py") == file_budget.DEFAULT_BUDGET_S
    monkeypatch.setenv(file_budget.ENV, "0")
    assert file_budget.budget_for("test_harness_gpu.py") == 0.0  # off

"""`pytest.mark.xdist_group` keeps its tests on one worker under `--dist loadgroup`
(tests/conftest.py puts the group into the structured node id that pytest 9.2 reads:
pytest-dev/pytest-xdist#1386). Several files rely on it: a module fixture paid once (the jail's
attacks, a local Ray), the hostile table's uncontained rows one after another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("xdist")

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.conftest import pytest_collection_modifyitems  # noqa: F401 - the hook under test
"""

TESTS = """
import os
import pytest

@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.xdist_group("one")) for i in range(6)]
                         + [pytest.param(i) for i in range(6, 12)])
def test_where(i, tmp_path_factory):
    log = tmp_path_factory.getbasetemp().parent / "where.log"
    with open(log, "a") as f:
        f.write(f"{i} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def test_a_groups_tests_run_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_where.py").write_text(TESTS)
    base = tmp_path / "base" / "run"
    base.parent.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "--basetemp", str(base), "-o", "addopts=", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    where = dict(line.split() for line in (base / "where.log").read_text().splitlines())
    assert len(where) == 12
    grouped = {where[str(i)] for i in range(6)}
    assert len(grouped) == 1, where  # the group: one worker

"""server/bytecode.py: a GPU server byte-compiles, beside its start, what its jailed jobs import
(Inductor) where the installation has no bytecode; fresh files are left alone, and nothing is
done where it is off or the installation is not writable."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelagent.harness.server import bytecode


def _package(root: Path) -> tuple[Path, Path]:
    pkg = root / "pkg"
    first = pkg / "first"
    (first / "deep").mkdir(parents=True)
    for path, text in {pkg / "__init__.py": "A = 1\n", pkg / "other.py": "def f():\n    return 2\n",
                       first / "__init__.py": "", first / "mod.py": "X = [i * i for i in range(3)]\n",
                       first / "deep" / "inner.py": "Y = 'y'\n", first / "broken.py": "def (:\n"}.items():
        path.write_text(text)
    return pkg, first


def _compiled(tmp_path: Path) -> tuple[Path, Path]:
    """_package without its file that cannot compile, compiled once by the helper."""
    pkg, first = _package(tmp_path)
    (first / "broken.py").unlink()
    background, _ = bytecode.compile_in_background([first, pkg], workers=1)
    assert background is not None and background.wait(120).startswith("bytecode: 5 of 5")
    return pkg, first


def test_the_helper_compiles_every_file_where_python_looks_and_then_has_nothing_to_do(tmp_path):
    pkg, first = _package(tmp_path)
    assert not any(bytecode.fresh(p) for p in pkg.rglob("*.py"))
    background, state = bytecode.compile_in_background([first, pkg], workers=2)
    assert background is not None and state.startswith("compiling 2 folders"), state
    line = background.wait(120)
    # broken.py cannot compile: it is left to fail at import, as before; the other five are written
    assert line.startswith("bytecode: 5 of 6 files compiled"), line
    for path in pkg.rglob("*.py"):
        assert bytecode.fresh(path) == (path.name != "broken.py"), path
        if path.name != "broken.py":
            assert Path(importlib.util.cache_from_source(str(path))).is_file()
    # first/'s own files, all fresh but the one that cannot compile: still wanted (broken.py)
    assert bytecode.needed([first, pkg])[0] is True
    (first / "broken.py").unlink()
    assert bytecode.compile_in_background([first, pkg], workers=2) == (None, "present")


def test_a_changed_source_is_stale_and_compiled_again(tmp_path):
    pkg, first = _compiled(tmp_path)
    mod = first / "mod.py"
    mod.write_text("X = [i * i for i in range(30)]\n")  # another size
    os.utime(mod, (1_000_000_000, 1_000_000_000))  # and another mtime
    assert not bytecode.fresh(mod)
    background, _ = bytecode.compile_in_background([first, pkg], workers=1)
    assert background is not None and background.wait(120).startswith("bytecode: 1 of 5"), background.line
    assert bytecode.fresh(mod)


def test_python_loads_what_the_helper_wrote_without_compiling(tmp_path):
    _, first = _compiled(tmp_path)
    # Where Python finds a usable .pyc it never reads the source's code: a source replaced by a
    # same-size, same-mtime text that would raise is not run.
    mod = first / "mod.py"
    st = mod.stat()
    mod.write_text("raise SystemExit(9)\n".ljust(st.st_size - 1) + "\n")
    os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert mod.stat().st_size == st.st_size
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import pkg.first.mod as m; print(m.X)"
    out = subprocess.run([sys.executable, "-I", "-B", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[0, 1, 4]", (out.stdout, out.stderr)


def test_one_helper_compiles_at_a_time(tmp_path):
    """The servers of a multi-GPU bench start together: the second helper leaves the work to the
    first (a lock on the first folder), and writes nothing."""
    import fcntl

    pkg, first = _package(tmp_path)
    fd = os.open(first, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        background, _ = bytecode.compile_in_background([first, pkg], workers=1)
        assert background is not None
        assert background.wait(120) == f"bytecode: another server's helper is compiling {first}"
        assert not any(bytecode.fresh(p) for p in pkg.rglob("*.py"))
    finally:
        os.close(fd)
    background, _ = bytecode.compile_in_background([first, pkg], workers=1)
    assert background is not None and background.wait(120).startswith("bytecode: 5 of 6 files compiled")


def test_nothing_is_started_when_off_unwritable_or_without_torch(tmp_path, monkeypatch):
    pkg, first = _package(tmp_path)
    monkeypatch.setenv("KERNELAGENT_BYTECODE", "0")
    assert bytecode.compile_in_background([first, pkg]) == (None, "off (KERNELAGENT_BYTECODE=0)")
    monkeypatch.delenv("KERNELAGENT_BYTECODE")
    monkeypatch.setattr(bytecode.os, "access", lambda path, mode: False)
    assert bytecode.compile_in_background([first, pkg]) == (None, f"not writable: {first}")
    assert bytecode.compile_in_background([]) == (None, "no installed torch found")
    assert not any(bytecode.fresh(p) for p in pkg.rglob("*.py"))


def test_inductors_folder_comes_first_and_nothing_is_imported_to_find_it():
    pytest.importorskip("torch")
    code = ("import sys\nfrom kernelagent.harness.server import bytecode\nr = bytecode.roots()\n"
            "print(r[0].as_posix().endswith('torch/_inductor'), any(p.name == 'torch' for p in r), "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False"], out.stdout

"""Bytecode for the modules a job imports in its jail (issue 59): written once, beside the server.

A job's processes see the installation read-only (jail/mounts.py), so a module they import
that has no bytecode yet is compiled from source in every one of them, and written nowhere.
On a GPU every problem's baselines import Inductor that way (the server itself never imports
it: server/main.py `_import_once`), and so does a candidate that calls torch.compile. Where the
installation has no bytecode for them (`uv pip install` without `--compile-bytecode`, an image
built with PYTHONDONTWRITEBYTECODE=1, the H200 machines we measure on), that compile was 2.6 s of
a cold `eval`'s critical path on an H200 (2.0 s of importing Inductor, 0.6 s more in its first
compile), and again for every new problem of a warm harness.

So a server that expects CUDA starts `compile_in_background` before its own imports: a trusted
helper (interpreter.code_argv: isolated, installed code only) byte-compiles those packages where
Python itself would put their bytecode (importlib.util.cache_from_source, each file written
atomically by py_compile, as `pip install` does at install time), Inductor's first. Nothing is
compiled that is already fresh, nothing where the installation is not writable, and nothing of
a candidate's: only files of the installation, read by our own process. It is off with
KERNELAGENT_BYTECODE=0. The server's processes run isolated (`-I`), which ignores
PYTHONDONTWRITEBYTECODE, as every server's own imports always have.

Its answer is one line in the server's fingerprint (`bytecode`): compiling, present, or why not.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from kernelagent import settings

# Inductor's import and first compile, in the order they are needed: these are compiled first.
FIRST = ("torch/_inductor", "torch/_functorch", "torch/_decomp", "torch/_prims", "torch/_refs",
         "torch/_higher_order_ops", "torch/_subclasses", "torch/_library", "torch/_export", "torch/export",
         "torch/fx", "torch/utils")
# Then the rest of these packages (what a candidate's torch.compile may also reach).
PACKAGES = ("torch", "triton", "networkx", "jinja2", "markupsafe", "sympy", "mpmath")
MAX_WORKERS = 16
HEADER = 16  # a .pyc's header: magic, flags, source mtime, source size (PEP 552)


def package_dir(name: str) -> Path | None:
    """Where a top-level package's files are, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def roots() -> list[Path]:
    """The folders to compile, Inductor's first: those of FIRST, then each package of PACKAGES."""
    found: list[Path] = []
    torch_dir = package_dir("torch")
    if torch_dir is not None:
        found += [torch_dir.parent / rel for rel in FIRST if (torch_dir.parent / rel).is_dir()]
    found += [d for d in (package_dir(name) for name in PACKAGES) if d is not None]
    return found


def fresh(source: Path) -> bool:
    """Whether Python would load `source`'s bytecode rather than compile it: a .pyc where
    importlib looks, of this interpreter's magic number, recording the source's mtime and size
    (or a hash-based one, which Python checks itself)."""
    try:
        st = source.stat()
        with open(importlib.util.cache_from_source(str(source)), "rb") as handle:
            head = handle.read(HEADER)
    except (OSError, ValueError, NotImplementedError):
        return False
    if len(head) < HEADER or head[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(head[4:8], "little") & 0b1:  # hash-based: validated (or not) by Python itself
        return True
    return (int.from_bytes(head[8:12], "little") == (int(st.st_mtime) & 0xFFFFFFFF)
            and int.from_bytes(head[12:16], "little") == (st.st_size & 0xFFFFFFFF))


def sources(folders: Iterable[Path]) -> Iterator[Path]:
    """Every .py file under `folders`, each once, in the folders' order (no symlinked folder)."""
    seen: set[Path] = set()
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(importlib.machinery.SOURCE_SUFFIXES[0]):
                    path = Path(dirpath) / name
                    if path not in seen:
                        seen.add(path)
                        yield path


def needed(folders: list[Path]) -> tuple[bool, str]:
    """(whether to compile, why not): the first folder (Inductor's) is checked, its own files only:
    all fresh means an earlier server (or the install) compiled them."""
    if not folders:
        return False, "no installed torch found"
    first = folders[0]
    if not os.access(first, os.W_OK):
        return False, f"not writable: {first}"
    stale = [p for p in sorted(first.glob("*.py")) if not fresh(p)]
    return (True, "") if stale else (False, "present")


def _compile_one(path: str) -> int:
    import py_compile

    if fresh(Path(path)):
        return 0
    try:  # None where it does not compile: that file fails at its import, as it would have
        return 1 if py_compile.compile(path, quiet=2) else 0
    except Exception:  # noqa: BLE001 - an unreadable file or folder: left to the import too
        return 0


def helper_main(argv: list[str]) -> int:
    """The helper's body (`compile_in_background`): WORKERS FOLDER...; prints one line, the files
    compiled and the seconds."""
    import fcntl
    import multiprocessing

    started = time.monotonic()
    workers, folders = int(argv[0]), [Path(a) for a in argv[1:]]
    # One helper at a time per installation (the servers of a multi-GPU bench start together): a
    # lock on the first folder itself, so nothing is created; held until this process ends.
    held = os.open(folders[0], os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"bytecode: another server's helper is compiling {folders[0]}", flush=True)
        return 0
    files = [str(p) for p in sources(folders)]
    if workers <= 1:
        done = sum(_compile_one(f) for f in files)
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            done = sum(pool.imap(_compile_one, files, chunksize=16))
    print(f"bytecode: {done} of {len(files)} files compiled in {time.monotonic() - started:.1f} s", flush=True)
    return 0


HELPER = "import sys\nfrom kernelagent.harness.server import bytecode\nsys.exit(bytecode.helper_main(sys.argv[1:]))\n"


class Background:
    """The helper's process, waited for by a thread (so it is reaped); `line` its answer."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.line = ""
        self._thread = threading.Thread(target=self._wait, name="kernelagent-bytecode", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        out, _ = self.proc.communicate()
        self.line = (out or "").strip().splitlines()[-1][:300] if (out or "").strip() else \
            f"bytecode: the helper ended with {self.proc.returncode}"
        print(f"kernelagent harness: {self.line}", file=sys.stderr, flush=True)  # the server's log

    def wait(self, timeout: float | None = None) -> str:
        self._thread.join(timeout)
        return self.line


def compile_in_background(folders: list[Path] | None = None, *,
                          workers: int | None = None) -> tuple[Background | None, str]:
    """Start the helper where it is wanted: (its Background, what the fingerprint says)."""
    if settings.get("KERNELAGENT_BYTECODE") is False:
        return None, "off (KERNELAGENT_BYTECODE=0)"
    folders = roots() if folders is None else folders
    wanted, why = needed(folders)
    if not wanted:
        return None, why
    from kernelagent.harness import interpreter

    if workers is None:
        workers = max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) // 2))
    try:
        proc = subprocess.Popen(interpreter.code_argv(HELPER, str(workers), *map(str, folders)), cwd="/",
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=_helper_environ())
    except OSError as exc:
        return None, f"not started: {exc}"
    return Background(proc), f"compiling {len(folders)} folders in the background ({workers} workers)"


def _helper_environ() -> dict[str, str]:
    """The server's environment (already scrubbed), less what would change where bytecode goes."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "SOURCE_DATE_EPOCH")}

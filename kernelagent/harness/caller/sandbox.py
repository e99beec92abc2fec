"""What a candidate's process may see: a scrubbed environment and a scratch directory.

The harness server (and so every candidate it forks) starts with `scrubbed_environ()`,
so API keys never reach candidate code. Each candidate then runs with its own scratch
directory as working directory, HOME and TMPDIR.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

# Any variable whose name contains one of these words is dropped, whatever its case.
SECRET_NAME_PATTERN = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME_PATTERN.search(name))


def scrubbed_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment without secrets."""
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items() if not is_secret_name(k)}


def make_scratch_root() -> Path:
    """A private directory under which each evaluation gets its own scratch folder."""
    return Path(tempfile.mkdtemp(prefix="kernelagent-scratch-"))


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _hide_home(scratch_root: Path, extra_ro: list[Path]) -> list[str]:
    """bwrap arguments that replace the user's home with an empty tmpfs (its keys, tokens and
    config files are out of reach), binding back read-only what Python needs from it: the
    interpreter, its packages and this package, when they live there."""
    import sys

    home = Path(os.path.expanduser("~")).resolve()
    if str(home) in ("/", "") or not home.is_dir():
        return []
    needed = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(__file__).resolve().parents[2],
              *extra_ro, *(Path(p) for p in sys.path if p)]
    keep: list[Path] = []
    for path in needed:
        try:
            path = path.resolve()
        except OSError:
            continue
        if path.exists() and (path == home or home in path.parents):
            if path == home:
                return []  # Python or this package lives in the home directory itself
            if not any(k == path or k in path.parents for k in keep):
                keep = [k for k in keep if path not in k.parents] + [path]
    if scratch_root.resolve() == home or home in scratch_root.resolve().parents:
        keep.append(scratch_root.resolve())
    args = ["--tmpfs", str(home)]
    for path in sorted(keep, key=lambda p: len(p.parts)):
        args += ["--ro-bind", str(path), str(path)]
    return args + ["--remount-ro", str(home)]


def bubblewrap_command(scratch_root: Path, extra_ro: list[Path] | None = None,
                       extra_rw: list[Path] | None = None) -> list[str] | None:
    """The bwrap prefix that runs the harness server in a real sandbox, or None when
    bubblewrap is missing or cannot create namespaces here.

    Read-only root, a writable scratch root, no network, the GPU device nodes bound, and
    death with the parent.
    """
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return None
    cmd = [
        bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
        # A private /dev/shm: the harness's processes share tensors through it, nobody else.
        "--tmpfs", "/dev/shm",
    ]
    extra_rw = [Path(p).resolve() for p in (extra_rw or [])]
    # Writable places under the home directory get a mount point before the home turns read-only.
    cmd += _hide_home(scratch_root, (extra_ro or []) + extra_rw)
    for path in extra_rw:  # e.g. the cache of built CUDA extensions (written by the server only)
        cmd += ["--bind", str(path), str(path)]
    cmd += [
        # No private /tmp: the interpreter or a virtualenv may live there (CI clones do).
        # TMPDIR points into the scratch directory instead, the only writable place.
        "--bind", str(scratch_root), str(scratch_root),
        # No --die-with-parent: it follows the *thread* that started bwrap, so a server
        # started from a short-lived worker thread would be killed with it. The server
        # exits by itself when the caller's socket closes.
        "--unshare-net", "--unshare-ipc",
    ]
    try:
        probe = subprocess.run(cmd + ["true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cmd if probe.returncode == 0 else None

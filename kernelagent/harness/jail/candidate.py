"""The candidate's sandbox: decided once when the server starts (`resolve`), entered first thing
in every candidate process (`enter`), before any candidate code exists there.

The namespace machinery itself is in namespaces.py. Modes:
- "namespaces": per-job user, pid, mount, net, ipc and uts namespaces; a minimal read-only view
  of the machine (VISIBLE_TOP, the interpreter and its packages; the caches, the store, the
  other jobs' scratch, the home and the caller's working directory hidden); an unprivileged uid
  (job_uid) when the server runs as root;
  a private /dev/shm and /proc; zero capabilities; death of the job's pid 1 ends every process
  it started.
- "none": every inherited descriptor is closed and the job gets a process group of its own;
  nothing else. Every result says so, and the CLI warns.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from kernelagent import settings
from kernelagent.harness.jail import probe as jail_probe


# The top-level directories a job sees: the system's programs, libraries and configuration, the
from kernelagent.harness.jail import namespaces
# devices and the kernel's views. Every other top-level directory (/home, /root, /tmp, /var,
# /srv, /mnt, /work, /data...) is replaced by an empty read-only tmpfs, and what the interpreter
# needs from under one is bound back read-only (_kept_readable): the minimal view of issue 24.
VISIBLE_TOP = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "dev", "proc",
                         "sys", "nix", "gnu"})
# The uid a job runs as when the server runs as root (65534, "nobody", is mapped in nearly every
# container's uid range); KERNELAGENT_JOB_UID overrides it. Files only root may read are then out
# of the job's reach even where the view shows them.
DEFAULT_JOB_UID: int = settings.BY_NAME["KERNELAGENT_JOB_UID"].default


def job_uid() -> tuple[int, int] | None:
    """(uid, gid) for jobs, or None when the server is not root (jobs keep the caller's uid)."""
    if os.geteuid() != 0:
        return None
    try:
        uid = settings.get("KERNELAGENT_JOB_UID")
    except ValueError:  # the CLI refuses it at its start (settings.check_environment)
        uid = DEFAULT_JOB_UID
    return (uid, uid) if uid > 0 else None


def _needed_paths() -> list[Path]:
    """What candidate code reads after the jail is entered: the interpreter, its site
    directories, this package, and the packages the server has imported (torch, Triton...).
    Not sys.path as a whole: it holds the caller's working directory and the repository root
    (the server's PYTHONPATH), whose other files (a project's .env) the job must not see."""
    import site

    needed = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(__file__).resolve().parents[2]]
    try:
        needed += [Path(p) for p in site.getsitepackages()]
    except AttributeError:  # virtualenv's old site.py
        pass
    needed += [Path(p) for p in sys.path if p and ("site-packages" in p or "dist-packages" in p or p.endswith(".zip"))]
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or "." in getattr(module, "__name__", "."):
            continue  # submodules live in their top-level package's directory
        path = Path(file)
        if path.name.startswith("__init__."):  # a package; single files lie in the prefixes or site dirs
            needed.append(path.parent)
    return needed


def _kept_readable(hide: list[Path]) -> list[Path]:
    """What candidate code still needs to read under a hidden directory (_needed_paths)."""
    keep: list[Path] = []
    for path in _needed_paths():
        try:
            path = path.resolve()
        except OSError:
            continue
        if not path.is_dir() or not any(h == path or h in path.parents for h in hide):
            continue
        if any(h == path for h in hide):
            continue  # a hidden directory that is itself needed: it is not hidden then (see resolve)
        if not any(k == path or k in path.parents for k in keep):
            keep = [k for k in keep if path not in k.parents] + [path]
    return keep


def _interpreter_dirs() -> set[Path]:
    """The directories the interpreter lives in as a whole: never hidden (then nothing runs)."""
    return {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}


def hidden_tops() -> list[Path]:
    """Every real top-level directory outside VISIBLE_TOP (symlinks such as /lib -> usr/lib
    lead into a visible one), but one the interpreter lives in as a whole."""
    interpreter = _interpreter_dirs()
    tops = [Path("/", entry.name) for entry in os.scandir("/")
            if entry.name not in VISIBLE_TOP and entry.is_dir(follow_symlinks=False)]
    return [top for top in tops if top not in interpreter]


def tops_now(hide: list[Path]) -> list[Path]:
    """The top-level directories to hide besides `hide`, listed as a job enters its jail (not
    once at the server's start): a harness may serve jobs for hours while the host makes new
    ones (a world-readable secret in a directory of its own is hidden from a job that starts
    after it appeared, as from one that started before), and one the host has replaced by a
    file since is no directory to hide (`mounts.hide_all`: a test's passing file in / failed
    other servers' jobs)."""
    known = set(hide)
    return [top for top in hidden_tops() if top not in known]


def _said(path: Path, cwd: Path) -> str:
    """A path for the result's isolation field: the caller's working directory by role, not by
    name (its name is the caller's, and results travel: reports, datasets)."""
    if path == cwd:
        return "<working directory>"
    if cwd in path.parents:
        return str(Path("<working directory>") / path.relative_to(cwd))
    return str(path)


def resolve(requested: str, scratch_root: Path, hide: list[str] | None = None) -> dict[str, Any]:
    """The jail every job of this server gets. `requested`: "auto" (namespaces where they work,
    else none, said in every result), "namespaces" (refuse to start without them) or "none"."""
    if requested not in ("auto", "namespaces", "none"):
        raise RuntimeError(f"unknown isolation {requested!r}: use auto, namespaces or none")
    if requested == "none":
        return {"mode": "none", "describe": {"mode": "none", "summary": "no per-job namespaces (asked for none)"}}
    home = Path(os.path.expanduser("~")).resolve()
    cwd = Path.cwd().resolve()
    paths = [Path(p).resolve() for p in (hide or [])] + [Path(scratch_root).resolve(), cwd]
    if str(home) not in ("/", "") and home.is_dir():
        paths.append(home)
    named = set(paths)
    paths += hidden_tops()
    # Never hide a directory the interpreter itself lives in as a whole (then nothing would run),
    # nor the root or a visible top-level directory as a whole (a caller working in /usr).
    interpreter = _interpreter_dirs()
    paths = [p for p in dict.fromkeys(paths) if p not in interpreter and p != Path("/")
             and not (len(p.parts) == 2 and p.name in VISIBLE_TOP)]
    keep_ro = _kept_readable(paths)
    probe = jail_probe.probe(scratch_root, hide=paths, keep_ro=keep_ro, run_as=job_uid())
    if not probe.get("namespaces_work"):
        if requested == "namespaces":
            raise RuntimeError(f"per-job namespaces do not work here: {probe.get('jail')}")
        return {"mode": "none", "describe": {"mode": "none", "summary": "per-job namespaces unavailable here: "
                                             f"{str(probe.get('jail'))[:300]}"}}
    run_as = probe.get("run_as")
    if run_as:
        who = f"uid {run_as[0]} (unprivileged)"
    elif namespaces._outer_uid_is_root(os.geteuid()):
        who = f"uid 0 outside: files only root may read stay readable where the view shows them ({probe.get('run_as_error')})"
    else:
        who = f"the caller's uid {os.geteuid()}"
    # "hide": what the caller named, the scratch root, its working directory and home (each
    # must be a directory); the top-level directories are listed anew as each job enters.
    return {"mode": "namespaces", "hide": [str(p) for p in paths if p in named],
            "keep_ro": [str(p) for p in keep_ro],
            "run_as": run_as,
            "describe": {"mode": "namespaces", "root": probe.get("root"), "in_bubblewrap": probe.get("in_bubblewrap"),
                         "hidden": [_said(p, cwd) for p in paths], "keep_ro": [_said(p, cwd) for p in keep_ro],
                         "job_uid": who,
                         "summary": "per-job user/pid/mount/net/ipc namespaces, read-only minimal view (system "
                                    "directories, the interpreter and its packages; home, working directory, "
                                    "caches, store and other jobs hidden), private /dev/shm and /proc, no "
                                    f"capabilities, running as {who.split(':')[0]}"}}


def enter(workdir: Path, jail: dict[str, Any], keep_fds: list[int], log_path: Path) -> dict[str, Any]:
    """Called first thing in the candidate's process. stdout/stderr go to the job's log first
    (the jail keeps fds 0-2 and closes every other inherited descriptor)."""
    fd = os.open(str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if jail.get("mode") != "namespaces":
        return namespaces.enter_job_jail(workdir, [], keep_fds, "none")
    run_as = jail.get("run_as")
    hide = [Path(p) for p in jail["hide"]]
    return namespaces.enter_job_jail(workdir, hide, keep_fds, "namespaces", listed_tops=tops_now(hide),
                                     keep_ro=[Path(p) for p in jail.get("keep_ro", [])],
                                     run_as=(int(run_as[0]), int(run_as[1])) if run_as else None)

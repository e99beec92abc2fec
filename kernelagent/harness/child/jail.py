"""The candidate's sandbox: decided once when the server starts (`resolve`), entered first thing
in every candidate process (`enter`), before any candidate code exists there.

The namespace machinery itself is in namespaces.py. Modes:
- "namespaces": per-job user, pid, mount, net, ipc and uts namespaces; a read-only view of the
  machine with the caches, the store, the other jobs' scratch and the user's home hidden;
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

from kernelagent.harness.child import jail_probe, namespaces


def _kept_readable(hide: list[Path]) -> list[Path]:
    """What candidate code still needs to read under a hidden directory: the interpreter, its
    packages and this package (lazy imports happen after the jail is entered)."""
    needed = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(__file__).resolve().parents[3],
              *(Path(p) for p in sys.path if p)]
    keep: list[Path] = []
    for path in needed:
        try:
            path = path.resolve()
        except OSError:
            continue
        if not path.exists() or not any(h == path or h in path.parents for h in hide):
            continue
        if any(h == path for h in hide):
            continue  # a hidden directory that is itself needed: it is not hidden then (see resolve)
        if not any(k == path or k in path.parents for k in keep):
            keep = [k for k in keep if path not in k.parents] + [path]
    return keep


def resolve(requested: str, scratch_root: Path, hide: list[str] | None = None) -> dict[str, Any]:
    """The jail every job of this server gets. `requested`: "auto" (namespaces where they work,
    else none, said in every result), "namespaces" (refuse to start without them) or "none"."""
    if requested not in ("auto", "namespaces", "none"):
        raise RuntimeError(f"unknown isolation {requested!r}: use auto, namespaces or none")
    if requested == "none":
        return {"mode": "none", "describe": {"mode": "none", "summary": "no per-job namespaces (asked for none)"}}
    probe = jail_probe.probe(scratch_root)
    if not probe.get("namespaces_work"):
        if requested == "namespaces":
            raise RuntimeError(f"per-job namespaces do not work here: {probe.get('jail')}")
        return {"mode": "none", "describe": {"mode": "none", "summary": "per-job namespaces unavailable here: "
                                             f"{str(probe.get('jail'))[:300]}"}}
    home = Path(os.path.expanduser("~")).resolve()
    paths = [Path(p).resolve() for p in (hide or [])] + [Path(scratch_root).resolve()]
    if str(home) not in ("/", "") and home.is_dir():
        paths.append(home)
    # Never hide a directory the interpreter itself lives in as a whole (then nothing would run).
    interpreter = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    paths = [p for p in paths if p not in interpreter and not any(p in i.parents and p == i for i in interpreter)]
    keep_ro = _kept_readable(paths)
    return {"mode": "namespaces", "hide": [str(p) for p in paths], "keep_ro": [str(p) for p in keep_ro],
            "describe": {"mode": "namespaces", "root": probe.get("root"), "in_bubblewrap": probe.get("in_bubblewrap"),
                         "hidden": [str(p) for p in paths],
                         "summary": "per-job user/pid/mount/net/ipc namespaces, read-only root, caches, store, "
                                    "home and other jobs hidden, private /dev/shm and /proc, no capabilities"}}


def enter(workdir: Path, jail: dict[str, Any], keep_fds: list[int], log_path: Path) -> dict[str, Any]:
    """Called first thing in the candidate's process. stdout/stderr go to the job's log first
    (the jail keeps fds 0-2 and closes every other inherited descriptor)."""
    fd = os.open(str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if jail.get("mode") != "namespaces":
        return namespaces.enter_job_jail(workdir, [], keep_fds, "none")
    return namespaces.enter_job_jail(workdir, [Path(p) for p in jail["hide"]], keep_fds, "namespaces",
                                     keep_ro=[Path(p) for p in jail.get("keep_ro", [])])

"""Run a program inside the per-job jail (namespaces.py), for the processes the harness does not
fork itself: Nsight Compute, which starts the candidate's code in a process of its own.

    python -m kernelagent.harness.jail.exec_in --scratch DIR [--hide DIR ...] [--hide-tops] [--keep-ro DIR ...] [--run-as UID:GID] -- PROGRAM ARGS...

--hide-tops hides every top-level directory outside the system ones as well, listed as the jail
is entered (jail.tops_now), as each evaluation job's jail does. --keep-ro binds a directory
under a hidden one back read-only (a toolchain's own files: the CUDA toolkit where it lives
under a hidden directory); one that is hidden itself, or holds a hidden one, is not bound back.

The jail is the one every evaluation job gets (user, pid, mount, net, ipc and uts namespaces;
a read-only root with the caches, the store, other jobs' scratch and the home hidden; no
capabilities), plus a private writable /tmp and a loopback interface that ncu needs to talk to
its target. It replaces bubblewrap where bubblewrap is not installed: the kernel namespaces are
the sandbox either way, never Python code. The process exits with PROGRAM's status; whoever
kills it (a timeout) ends everything inside, since the jail's pid 1 dies with it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Exit status when the jail itself could not be entered (PROGRAM never ran); the caller says so.
JAIL_FAILED = 97
JAIL_FAILED_LINE = "kernelagent: the jail could not be entered"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kernelagent.harness.jail.exec_in")
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("--hide-tops", action="store_true", help="hide the top-level directories too")
    parser.add_argument("--keep-ro", action="append", default=[], help="a directory under a hidden one to read")
    parser.add_argument("--run-as", default=None, help="UID:GID the program runs as (a root caller only)")
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("no program to run")
    run_as = None
    if args.run_as:
        try:
            uid, gid = (int(x) for x in args.run_as.split(":"))
        except ValueError:
            parser.error("--run-as takes UID:GID")
        run_as = (uid, gid)
    import shutil

    from kernelagent.harness.jail import candidate as jail

    # The jail starts in the scratch directory: a relative program path is resolved here first.

    from kernelagent.harness.jail import namespaces
    found = shutil.which(program[0])
    if found is None:
        print(f"kernelagent: cannot run {program[0]}: not found", file=sys.stderr, flush=True)
        return 127
    program[0] = os.path.abspath(found)
    hide = [Path(h) for h in args.hide]
    tops = jail.tops_now(hide) if args.hide_tops else []
    hidden = hide + tops + [Path("/tmp").resolve()]
    keep_ro = jail._kept_readable(hidden)
    where = Path(program[0]).resolve().parent
    if any(h == where or h in where.parents for h in hidden) and where not in hidden:
        keep_ro.append(where)  # the program itself lives under a hidden directory: bound back read-only
    for path in (Path(k).resolve() for k in args.keep_ro):
        # A directory the caller names (a toolchain's), under a hidden one: bound back read-only,
        # never one that is hidden itself or holds a hidden one (the home, say).
        if path.is_dir() and any(h in path.parents for h in hidden) \
                and not any(h == path or path in h.parents for h in hidden) \
                and not any(k == path or k in path.parents for k in keep_ro):
            keep_ro.append(path)
    try:
        namespaces.enter_job_jail(Path(args.scratch), hide, [], "namespaces", keep_ro=keep_ro,
                                  private_tmp=True, loopback=True, run_as=run_as, listed_tops=tops)
    except (namespaces.JailError, OSError) as exc:
        print(f"{JAIL_FAILED_LINE}: {exc}", file=sys.stderr, flush=True)
        return JAIL_FAILED
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        print(f"kernelagent: cannot run {program[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The descriptors a job's process keeps: closed right after the fork, before any of the job's
code runs (jail/namespaces.py enters the jail with it; child/common.py and the server's forked
children call it directly)."""

from __future__ import annotations

import os


def close_inherited_fds(keep_fds: list[int]) -> list[int]:
    """Close every descriptor but 0, 1, 2 and `keep_fds`; returns the kept ones.

    Whatever the server held (the caller's socket, other jobs' pipes, cache files) would
    otherwise be usable by candidate code. os.closerange uses close_range(2) where it exists,
    so the gaps between kept fds cost one syscall each whatever the descriptor limit.
    Python objects that wrapped the closed fds still exist in the forked memory: the job must
    end with os._exit, not through interpreter shutdown, so no finaliser closes a reused fd.
    """
    keep = sorted({0, 1, 2, *(int(fd) for fd in keep_fds)})
    for fd in keep:
        os.fstat(fd)  # a kept fd that is not open is the caller's bug: fail loudly
    # The highest open fd bounds the last range (listing /proc/self/fd briefly opens one more).
    high = max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    low = 0
    for fd in keep:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(high, low))
    return keep

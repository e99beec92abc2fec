"""Hostile (issue 24, class 3): r3_partial_frame.py with EXIT = True (it dies mid-frame).

The candidate's process writes a length header and the first bytes of a frame to every pipe
and socket it holds (its channel to the server among them), in the middle of the correctness
checks, then either stays silent (KA_PARTIAL=sleep: `Connection.recv_bytes` in the server
waited for the rest with no deadline, past every stage limit) or exits (KA_PARTIAL=exit: the
server's bare OSError "got end of file during message" became `harness_error`, a verdict about
nobody, which an RL reward does not penalise). Either way it is the candidate's verdict:
`timeout` at the stage's limit, or `crashed` with its exit.

EXIT below picks the variant (the tests write a copy with it set; the jail passes nothing of
the caller's environment to choose it by).
"""
import os
import stat
import struct
import time

import torch
import torch.nn as nn
import triton
import triton.language as tl

EXIT = True


def _half_frame() -> None:
    for fd in range(3, 256):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
            try:
                os.write(fd, struct.pack("!i", 4096) + b'{"v": 2, "type": "outputs"')
            except OSError:
                pass
    if EXIT:
        os._exit(0)
    time.sleep(3600)


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:  # the first call is the compile stage's; this one is a check's
            _half_frame()
        x = x.contiguous()
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y

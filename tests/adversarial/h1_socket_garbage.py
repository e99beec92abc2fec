"""Hostile (issue 11, class 1): garbage on the inherited caller<->server socket.

How it gets through today: as h1_socket_pickle.py, the candidate finds the caller's socket
(fd N of `--fd N` in sys.argv) still open. It writes a frame of bytes that is no pickle; the
caller's `Connection.recv()` raises an UnpicklingError that `_round_trip` does not catch, so
`kernelagent eval` dies with a traceback (and a `bench` run would abort). Once fixed, garbage on
a channel is a verdict about the job (`rejected: protocol`), never a crash of the caller.

Its kernel is wrong (x*2+1): with the socket closed to it, the verdict is `incorrect`.
"""
import os
import struct
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl

def _attack() -> None:
    argv = list(sys.argv)
    fd = int(argv[argv.index("--fd") + 1])
    # A well-formed frame (4-byte big-endian length) whose body is not a pickle: the caller's
    # Connection.recv() raises UnpicklingError, which nothing there catches.
    data = b"ka-evil garbage \x00\xff\xfe not a pickle"
    os.write(fd, struct.pack("!i", len(data)) + data)


try:
    _attack()
except Exception:  # noqa: BLE001 - the socket is gone: the wrong kernel is all that is left
    pass


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

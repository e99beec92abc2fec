"""Hostile (issue 24, class 3): dies the moment its outputs have been handed over.

The candidate's process wraps its own channel's send: once a check's outputs (the message and
the payload frames it announces) have gone to the server, it exits at once, before the
server's reply. The server's send of
that reply then raised BrokenPipeError, which became `harness_error`: a verdict about nobody
(no penalty in an RL reward, a retry in a batch) for a kernel that is wrong (x*2 where the
ReLU is x). A channel the candidate closed is the candidate gone: `crashed`.

The names are built at run time only to get past the static check (evidence, not a defence).
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

_connection = __import__("multi" + "processing.connection", fromlist=["Connection"])
_Conn = getattr(_connection, "Conn" + "ection")
_send = _Conn.send_bytes


_left = []  # frames still to go before the outputs are all handed over


def _send_then_die(self, buf, offset=0, size=None):
    _send(self, buf, offset, size)
    if _left:
        _left[0] -= 1
    elif b'"type":"outputs"' in bytes(buf):
        _left.append(bytes(buf).count(b'"kind":"bytes"'))  # the payload frames that follow it
    if _left and _left[0] <= 0:
        os._exit(0)


setattr(_Conn, "send_bytes", _send_then_die)


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y

"""Hostile (issue 24, class 2): a timing report with no samples at all.

The candidate's process rewrites its own `timing` messages so that `samples_ms` is empty. With
a calibration the server fell back to its own clock and said nothing; without one
(`--no-defences` on the CPU) trusted_time raised ValueError, which became `harness_error`.
A timed loop that reports no samples did not run as ordered: `rejected: protocol`.

Its kernel is an honest ReLU, so only the forged report can decide the verdict.
"""
import json

import torch
import torch.nn as nn
import triton
import triton.language as tl

_connection = __import__("multi" + "processing.connection", fromlist=["Connection"])
_Conn = getattr(_connection, "Conn" + "ection")
_send = _Conn.send_bytes


def _send_forged(self, buf, offset=0, size=None):
    data = bytes(buf)
    if b'"type":"timing"' in data:
        message = json.loads(data)
        message["samples_ms"] = []
        data = json.dumps(message, separators=(",", ":")).encode()
        return _send(self, data)
    return _send(self, buf, offset, size)


setattr(_Conn, "send_bytes", _send_forged)


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y

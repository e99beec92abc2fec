"""Hostile (issue 41, class 3): every timing sample negative.

The candidate's process rewrites its own `timing` messages so that every sample is below zero.
They were dropped as invalid and the loop then had none: with the defences off that was a
harness error ("no timing samples and no server clock"), with them on `correct` with a review
flag. A time below zero is not a time: `rejected: protocol`.

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
        message["samples_ms"] = [-abs(float(x)) - 1.0 for x in message["samples_ms"]]
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

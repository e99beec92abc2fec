"""Hostile (issue 54, class 5): a profiler row whose `calls` is 10**400, sent before `done`.

`json.loads` built the integer; the server's first `math.isfinite` on it raised OverflowError, a
harness error. Bounded JSON refuses an integer past 2**63 by its digits: `rejected: protocol`.

Its kernel is an honest ReLU, so only the forged row can decide the verdict.
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
    if b'"type":"done"' in data:
        job = json.loads(data)["job"]
        row = {"v": 2, "type": "kernels", "job": job, "kernels": [{"name": "relu_kernel", "calls": 10**400}]}
        _send(self, json.dumps(row, separators=(",", ":")).encode())
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

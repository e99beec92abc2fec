"""Hostile (issue 54, class 5): a 200,000-deep JSON array as its check's outputs message.

`json.loads` in the server recursed once per level: a RecursionError, which the server took for
its own fault (`harness_error`, no penalty) instead of the wrong kernel's verdict. Bounded JSON
(harness/bounded_json.py) measures the depth on the raw bytes first: `rejected: protocol`, and
the server serves the next evaluation.

Its kernel is wrong (x*2+1): a laundered verdict would read harness_error.
"""
import json

import torch
import torch.nn as nn
import triton
import triton.language as tl

_connection = __import__("multi" + "processing.connection", fromlist=["Connection"])
_Conn = getattr(_connection, "Conn" + "ection")
_send = _Conn.send_bytes
_DEPTH = 200_000


def _send_forged(self, buf, offset=0, size=None):
    data = bytes(buf)
    if b'"type":"outputs"' in data:
        job = json.loads(data)["job"]
        forged = b'{"v":2,"type":"outputs","job":' + json.dumps(job).encode() + b',"outputs":' + \
            b"[" * _DEPTH + b"]" * _DEPTH + b"}"
        return _send(self, forged)
    return _send(self, buf, offset, size)

setattr(_Conn, "send_bytes", _send_forged)


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

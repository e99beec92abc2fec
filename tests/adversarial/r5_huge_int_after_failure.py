"""Hostile (issue 54, class 5): the same 10**400 profiler row, after failing a check.

Its kernel is wrong (x*2+1): the first check fails and the server collects its evidence before
concluding. There the row's OverflowError replaced `incorrect` with a harness error. Refused as
unbounded JSON, the row is only a breach at the end of an evaluation already decided: the check
it failed first stays its verdict.
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
        row = {"v": 2, "type": "kernels", "job": job, "kernels": [{"name": "wrong_kernel", "calls": 10**400}]}
        _send(self, json.dumps(row, separators=(",", ":")).encode())
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

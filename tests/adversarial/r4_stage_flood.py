"""Hostile (issue 41, class 3): a flood of progress messages.

Before each check's outputs the candidate's process sends 300,000 `stage` messages. The server
read them all (50.5 CPU-seconds where an honest run takes 2.1 s) and the verdict was `correct`.
The stage reports are bounded in count: `rejected: protocol`, at once.

Its kernel is an honest ReLU, so only the flood can decide the verdict.
"""
import json

import torch
import torch.nn as nn
import triton
import triton.language as tl

_connection = __import__("multi" + "processing.connection", fromlist=["Connection"])
_Conn = getattr(_connection, "Conn" + "ection")
_send = _Conn.send_bytes


_FLOODED = []


def _send_forged(self, buf, offset=0, size=None):
    data = bytes(buf)
    if b'"type":"outputs"' in data and not _FLOODED:
        _FLOODED.append(True)
        job = json.loads(data).get("job")
        flood = json.dumps({"type": "stage", "job": job, "stage": "correctness", "v": 2},
                           separators=(",", ":")).encode()
        for _ in range(300_000):
            _send(self, flood)
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
